"""Documentation and comparison built from the kernel registry, outside the kernel library.

* `docs`: docs/kernels.md, the reference of every registered kernel (`python -m jaxgrpo.catalog.docs`).
* `methods`: docs/methods.md, the method catalog and what runs each method (`python -m jaxgrpo.catalog.methods`).
* `peers`: the registries of verl, TRL and tunix mapped to these kernels, with their conventions.
* `demo`: a short tour of the kernels (`python -m jaxgrpo.catalog.demo`).
"""
