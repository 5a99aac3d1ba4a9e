"""benchmarks/gpu_programs.py reads what a decode step launches from XLA:GPU's optimized HLO: checked on a small
program written in that form (compiling for a GPU needs the CUDA build of jax, which CI does not install; without it
the script says so in one line)."""

import importlib.metadata
import os
import sys

import pytest

from tests.support.paths import REPO_ROOT

sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))
import gpu_programs  # noqa: E402

# A decode loop (trip count unknown) around a 4-layer scan (known) whose body slices a stacked weight (an
# asynchronous slice), multiplies by it (a Triton GEMM fusion), calls a Pallas kernel, multiplies through cuBLAS
# reading a slice in place, and copies; after the scan, a conditional whose larger branch holds two fusions.
HLO = """HloModule jit_engine_decode, is_scheduled=true

%fused_slice (param_0: bf16[4,8,16], param_1: s32[]) -> bf16[1,8,16] {
  %param_0 = bf16[4,8,16]{2,1,0} parameter(0)
  %param_1 = s32[] parameter(1)
  %constant_0 = s32[] constant(0)
  ROOT %dynamic-slice.1 = bf16[1,8,16]{2,1,0} dynamic-slice(%param_0, %param_1, %constant_0, %constant_0), dynamic_slice_sizes={1,8,16}
}

%gemm_computation (p0: bf16[2,8], p1: bf16[8,16]) -> f32[2,16] {
  %p0 = bf16[2,8]{1,0} parameter(0)
  %p1 = bf16[8,16]{1,0} parameter(1)
  %dot.1 = f32[2,16]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %bitcast.1 = f32[2,16]{1,0} bitcast(%dot.1)
}

%in_place_gemm (q0: bf16[2,8], q1: bf16[4,8,16], q2: s32[]) -> (f32[2,16], s8[64]) {
  %q0 = bf16[2,8]{1,0} parameter(0)
  %q1 = bf16[4,8,16]{2,1,0} parameter(1)
  %q2 = s32[] parameter(2)
  %z = s32[] constant(0)
  %slice = bf16[1,8,16]{2,1,0} dynamic-slice(%q1, %q2, %z, %z), dynamic_slice_sizes={1,8,16}
  %b = bf16[8,16]{1,0} bitcast(%slice)
  ROOT %gemm = (f32[2,16]{1,0}, s8[64]{0}) custom-call(%q0, %b), custom_call_target="__cublas$lt$matmul"
}

%fused_add (a0: f32[2,16]) -> f32[2,16] {
  %a0 = f32[2,16]{1,0} parameter(0)
  ROOT %add.1 = f32[2,16]{1,0} add(%a0, %a0)
}

%layer_body (carry: (s32[], bf16[4,8,16], bf16[2,8])) -> (s32[], bf16[4,8,16], bf16[2,8]) {
  %carry = (s32[], bf16[4,8,16]{2,1,0}, bf16[2,8]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%carry), index=0
  %w = bf16[4,8,16]{2,1,0} get-tuple-element(%carry), index=1
  %x = bf16[2,8]{1,0} get-tuple-element(%carry), index=2
  %fusion-start = ((bf16[4,8,16]{2,1,0}, s32[]), bf16[1,8,16]{2,1,0}, s32[]) fusion-start(%w, %i), kind=kLoop, calls=%fused_slice
  %fusion-done = bf16[1,8,16]{2,1,0} fusion-done(%fusion-start)
  %bw = bf16[8,16]{1,0} bitcast(%fusion-done)
  %gemm_fusion_dot = f32[2,16]{1,0} fusion(%x, %bw), kind=kCustom, calls=%gemm_computation, backend_config={"fusion_backend_config":{"kind":"__triton_nested_gemm_fusion"}}
  %pallas_call = f32[2,16]{1,0} custom-call(%gemm_fusion_dot), custom_call_target="__gpu$xla.gpu.triton"
  %dynamic_slice_fusion = (f32[2,16]{1,0}, s8[64]{0}) fusion(%x, %w, %i), kind=kCustom, calls=%in_place_gemm, backend_config={"fusion_backend_config":{"kind":"__custom_fusion","custom_fusion_config":{"name":"dynamic_slice_fusion"}}}
  %copy.1 = bf16[2,8]{1,0} copy(%x)
  ROOT %out = (s32[], bf16[4,8,16]{2,1,0}, bf16[2,8]{1,0}) tuple(%i, %w, %copy.1)
}

%layer_cond (c: (s32[], bf16[4,8,16], bf16[2,8])) -> pred[] {
  %c = (s32[], bf16[4,8,16]{2,1,0}, bf16[2,8]{1,0}) parameter(0)
  %ci = s32[] get-tuple-element(%c), index=0
  %four = s32[] constant(4)
  ROOT %lt = pred[] compare(%ci, %four), direction=LT
}

%small_branch (s0: f32[2,16]) -> f32[2,16] {
  %s0 = f32[2,16]{1,0} parameter(0)
  ROOT %f1 = f32[2,16]{1,0} fusion(%s0), kind=kLoop, calls=%fused_add
}

%large_branch (l0: f32[2,16]) -> f32[2,16] {
  %l0 = f32[2,16]{1,0} parameter(0)
  %f2 = f32[2,16]{1,0} fusion(%l0), kind=kLoop, calls=%fused_add
  ROOT %f3 = f32[2,16]{1,0} fusion(%f2), kind=kLoop, calls=%fused_add
}

%step_body (state: (s32[], bf16[4,8,16], bf16[2,8], f32[2,16], s32[])) -> (s32[], bf16[4,8,16], bf16[2,8], f32[2,16], s32[]) {
  %state = (s32[], bf16[4,8,16]{2,1,0}, bf16[2,8]{1,0}, f32[2,16]{1,0}, s32[]) parameter(0)
  %layers = (s32[], bf16[4,8,16]{2,1,0}, bf16[2,8]{1,0}) while(%state), condition=%layer_cond, body=%layer_body, backend_config={"known_trip_count":{"n":"4"}}
  %y = f32[2,16]{1,0} get-tuple-element(%state), index=3
  %branch = s32[] get-tuple-element(%state), index=4
  %conditional = f32[2,16]{1,0} conditional(%branch, %y, %y), branch_computations={%small_branch, %large_branch}
  ROOT %next = (s32[], bf16[4,8,16]{2,1,0}, bf16[2,8]{1,0}, f32[2,16]{1,0}, s32[]) tuple(%branch, %branch, %branch, %conditional, %branch)
}

%step_cond (d: (s32[], bf16[4,8,16], bf16[2,8], f32[2,16], s32[])) -> pred[] {
  %d = (s32[], bf16[4,8,16]{2,1,0}, bf16[2,8]{1,0}, f32[2,16]{1,0}, s32[]) parameter(0)
  ROOT %go = pred[] constant(true)
}

ENTRY %main (init: (s32[], bf16[4,8,16], bf16[2,8], f32[2,16], s32[])) -> (s32[], bf16[4,8,16], bf16[2,8], f32[2,16], s32[]) {
  %init = (s32[], bf16[4,8,16]{2,1,0}, bf16[2,8]{1,0}, f32[2,16]{1,0}, s32[]) parameter(0)
  %copy.0 = (s32[], bf16[4,8,16]{2,1,0}, bf16[2,8]{1,0}, f32[2,16]{1,0}, s32[]) copy(%init)
  ROOT %loop = (s32[], bf16[4,8,16]{2,1,0}, bf16[2,8]{1,0}, f32[2,16]{1,0}, s32[]) while(%copy.0), condition=%step_cond, body=%step_body
}
"""


def test_a_decode_step_is_counted_per_layer_with_its_slices_gemms_calls_copies_and_round_trips():
    counts = gpu_programs.decode_step_counts(HLO)
    assert counts["decode_loop_trips"] is None
    assert counts["operations"] == {"slice of stacked weights or cache": 4, "GEMM": 4, "Triton call (Pallas)": 4,
                                    "GEMM of a slice in place": 4, "copy": 4, "fusion": 2}
    assert counts["operations_total"] == 22
    # Each layer copies its bf16[1,8,16] weight slice (256 B) and a bf16[2,8] activation (32 B).
    assert counts["copied_bytes"] == 4 * (256 + 32)
    # The scan's trip count is known (no predicate to the host); the conditional's index goes there once, and so
    # does the decode loop's predicate once a step.
    assert counts["host_round_trips"] == 2
    assert counts["loops"] == [{"body": "layer_body", "trips": 4}]
    # Bytes read and written, estimated from shapes: the copy reads and writes its bf16[2,8] (32 B) each layer.
    assert set(counts["traffic_bytes"]) == set(counts["operations"])
    assert counts["traffic_bytes"]["copy"] == 4 * 2 * 32
    assert counts["traffic_bytes_outside_gemms"] == sum(
        v for k, v in counts["traffic_bytes"].items() if not k.startswith("GEMM"))
    assert sum(counts["traffic_outside_gemms_by_scope"].values()) == counts["traffic_bytes_outside_gemms"]
    # The Triton GEMM fusion's dot, bf16[2,8] x bf16[8,16]: 2 x 32 x 8 FLOPs a layer (the cuBLAS call is not a dot).
    assert counts["gemm_flops_by_operand_types"] == {"bf16 x bf16": 4 * 2 * 32 * 8}


def test_scope_names_where_an_operation_comes_from_and_whether_it_is_a_gradient():
    def scope(op_name):
        return gpu_programs.scope(f'f32[2]{{0}} add(%a, %b), metadata={{op_name="{op_name}"}}')

    assert scope("jit(update)/while/body/eval_jaxpr/transpose(jvp(layers))/jvp(layers)/checkpoint/attention/qkv/"
                 "norm/mul") == "backward: layers/attention/qkv"
    assert scope("jit(update)/while/body/eval_jaxpr/jvp(logprob_head)/while/body/eval_jaxpr/reduce_max") == \
        "logprob_head"
    assert scope("jit(update)/while/body/layers/mlp/jit(silu)/logistic") == "layers/mlp"
    assert scope("jit(engine_decode)/while/body/layers/attention/out/bthk,hkd->btd/dot_general") == \
        "layers/attention/out"
    assert scope("jit(update)/add") == "(top)"
    assert gpu_programs.scope("f32[2]{0} add(%a, %b)") == "(unnamed)"


def test_without_the_cuda_build_of_jax_it_says_what_to_install():
    if any((d.metadata["Name"] or "").startswith("jax-cuda") for d in importlib.metadata.distributions()):
        pytest.skip("the CUDA build of jax is installed here: the script compiles instead")
    with pytest.raises(SystemExit, match=r'cannot compile for a CUDA GPU here .*pip install -e "\.\[gpu\]"'):
        gpu_programs.gpu_mesh("h100")


def test_an_unknown_remat_setting_is_refused_before_anything_compiles(capsys):
    with pytest.raises(SystemExit):
        gpu_programs.main(["--update", "--update-remat", "full,dots"])
    assert "unknown --update-remat dots; choose from full, off, save_attention, save_projections" in \
        capsys.readouterr().err
    from jaxgrpo.config import REMAT_POLICIES

    assert set(REMAT_POLICIES) <= set(gpu_programs.UPDATE_REMAT)


# An in-place scatter of two rows into a bf16[100,8] pool (its indices and rows computed in the fusion), a
# fusion that reads 4 rows of a float32[64,16] table through a dynamic slice and 16 bytes of another whole, and
# one that reads a layer of a float32[8, 4, 16] stack through a bitcast, and one that gathers a block of 512 of
# each row of float32[2, 1000] logits padded to 1024.
TRAFFIC = """HloModule traffic, is_scheduled=true

%write (pool: bf16[100,8], ids: s32[2,1], rows: f32[2,8]) -> bf16[100,8] {
  %pool = bf16[100,8]{1,0} parameter(0)
  %ids = s32[2,1]{1,0} parameter(1)
  %rows = f32[2,8]{1,0} parameter(2)
  %new = bf16[2,8]{1,0} convert(%rows)
  %view = bf16[100,8]{1,0} bitcast(%pool)
  ROOT %scatter = bf16[100,8]{1,0} scatter(%view, %ids, %new), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add
}

%read (table: f32[64,16], at: s32[], scale: f32[4]) -> f32[4,16] {
  %table = f32[64,16]{1,0} parameter(0)
  %at = s32[] parameter(1)
  %scale = f32[4]{0} parameter(2)
  %zero = s32[] constant(0)
  %rows = f32[4,16]{1,0} dynamic-slice(%table, %at, %zero), dynamic_slice_sizes={4,16}
  %wide = f32[4,16]{1,0} broadcast(%scale), dimensions={0}
  ROOT %product = f32[4,16]{1,0} multiply(%rows, %wide)
}

%layer (stack: f32[8,4,16], at: s32[]) -> f32[64] {
  %stack = f32[8,4,16]{2,0,1} parameter(0)
  %at = s32[] parameter(1)
  %zero = s32[] constant(0)
  %flat = f32[8,64]{1,0} bitcast(%stack)
  %one = f32[1,64]{1,0} dynamic-slice(%flat, %at, %zero), dynamic_slice_sizes={1,64}
  ROOT %row = f32[64]{0} bitcast(%one)
}

%block (logits: f32[2,1000], b: s32[2,1]) -> f32[2,1,512] {
  %logits = f32[2,1000]{1,0} parameter(0)
  %b = s32[2,1]{1,0} parameter(1)
  %lowest = f32[] constant(-3.4e+38)
  %padded = f32[2,1024]{1,0} pad(%logits, %lowest), padding=0_0x0_24
  %blocks = f32[2,2,512]{2,1,0} bitcast(%padded)
  ROOT %one = f32[2,1,512]{2,1,0} gather(%blocks, %b), offset_dims={1,2}, collapsed_slice_dims={}, start_index_map={1}, index_vector_dim=1, slice_sizes={1,1,512}
}

ENTRY %main (p: bf16[100,8], i: s32[2,1], r: f32[2,8], t: f32[64,16], a: s32[], s: f32[4], x: f32[8,4,16], l: f32[2,1000], c: s32[2,1]) -> f32[4,16] {
  %p = bf16[100,8]{1,0} parameter(0)
  %i = s32[2,1]{1,0} parameter(1)
  %r = f32[2,8]{1,0} parameter(2)
  %t = f32[64,16]{1,0} parameter(3)
  %a = s32[] parameter(4)
  %s = f32[4]{0} parameter(5)
  %written = bf16[100,8]{1,0} fusion(%p, %i, %r), kind=kInput, calls=%write
  %stacked = f32[8,4,16]{2,0,1} parameter(6)
  %sliced = f32[64]{0} fusion(%stacked, %a), kind=kLoop, calls=%layer
  %logits = f32[2,1000]{1,0} parameter(7)
  %chosen = s32[2,1]{1,0} parameter(8)
  %gathered = f32[2,1,512]{2,1,0} fusion(%logits, %chosen), kind=kLoop, calls=%block
  ROOT %read = f32[4,16]{1,0} fusion(%t, %a, %s), kind=kLoop, calls=%read
}
"""


def test_traffic_counts_an_in_place_update_by_its_update_and_a_sliced_operand_by_its_slice():
    program = gpu_programs.read_hlo(TRAFFIC)
    fusions = {name: rest for name, opcode, rest in program.computations[program.entry] if opcode == "fusion"}
    # The scatter writes its 2 bf16 rows (32 B), reads its indices (8 B) and float32 rows (64 B); not the pool.
    assert gpu_programs._traffic(program, fusions["written"]) == 32 + 8 + 64
    # The slice's 4 rows (256 B), not the whole table (4 KiB), with the index (4 B) and the scales (16 B) read and
    # the result (256 B) written.
    assert gpu_programs._traffic(program, fusions["read"]) == 256 + 4 + 16 + 256
    # A stack read through a bitcast (a layout change) and a slice of one layer: that layer (256 B), not the stack.
    assert gpu_programs._traffic(program, fusions["sliced"]) == 256 + 4 + 256
    # One block gathered per row from padded logits (the sampler's drawn block): the 2 blocks (4 KiB) and the
    # block ids (8 B) read, the blocks written; not the whole logits (8,000 B).
    assert gpu_programs._traffic(program, fusions["gathered"]) == 4096 + 8 + 4096
