"""GSM8K (Cobbe et al., 2021, "Training Verifiers to Solve Math Word Problems") as a TFDS builder.

The data comes from its public source, the openai/grade-school-math GitHub
repository (MIT license): `Gsm8k` downloads ``train.jsonl`` (7473 problems) and
``test.jsonl`` (1319) and checks their SHA-256. Offline, give a directory that
holds those two files as the TFDS manual directory::

    builder = Gsm8k(data_dir=prepared_dir, file_format="array_record")
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(manual_dir="path/to/gsm8k_jsonl"))
    test = builder.as_data_source("test")

Each example holds ``question``, ``solution`` (the full reference solution,
calculator notes ``<<...>>`` included) and ``answer``, the final answer after
``####`` with thousands separators removed (``"1,200"`` -> ``"1200"``).

Prepared data is keyed by its source (`source_config`): the published files (downloaded, or a local
copy with their SHA-256) are the builder config ``published``; any other pair of files is
``sha256_<16 hex digits>`` of their contents. So a different data directory (a subset, a corrected
copy) is prepared again in its own directory of the TFDS data dir, the same files reuse their
preparation, and a prepared directory never stands in for other data.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Mapping

import tensorflow_datasets as tfds

from jaxgrpo.data import jsonl
from jaxgrpo.errors import DataError, MissingDataError

SOURCE_URL = "https://raw.githubusercontent.com/openai/grade-school-math/master/grade_school_math/data"
URLS: Mapping[str, str] = {split: f"{SOURCE_URL}/{split}.jsonl" for split in ("train", "test")}
SHA256: Mapping[str, str] = {
    "train": "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465",
    "test": "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14",
}
SPLIT_SIZES: Mapping[str, int] = {"train": 7473, "test": 1319}

HOW_TO_PROVIDE = (
    "Put train.jsonl and test.jsonl of GSM8K in that directory (download them from "
    f"{SOURCE_URL}/{{train,test}}.jsonl), or pass no directory on a machine with internet access "
    "and the builder downloads them."
)


def final_answer(solution: str) -> str:
    """The final answer of a GSM8K reference solution: the text after ``####``, without commas."""
    marker = solution.rfind("####")
    if marker < 0:
        raise ValueError("solution has no '####' final-answer marker")
    answer = solution[marker + 4 :].strip().replace(",", "")
    if not answer:
        raise ValueError("solution has an empty final answer after '####'")
    return answer


def parse_example(record: dict) -> dict:
    """A GSM8K example from one jsonl record ``{"question", "answer"}`` (answer = full solution)."""
    if not {"question", "answer"} <= record.keys():
        raise ValueError("expected an object with keys 'question' and 'answer'")
    return {"question": record["question"], "solution": record["answer"], "answer": final_answer(record["answer"])}


def read_jsonl(path: os.PathLike | str) -> Iterator[tuple[int, dict]]:
    """Yields (line number, example) for each line of a GSM8K jsonl file.

    Raises:
      ValueError: naming the file and the line, for a line that is not JSON or
        lacks ``question``, ``answer`` or a ``####`` final answer.
    """
    return jsonl.parse_jsonl(path, parse_example, "GSM8K example")


def file_sha256(path: os.PathLike | str) -> str:
    """Hex SHA-256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as data:
        for block in iter(lambda: data.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


#: The builder config of the published files (downloaded, or a local copy with the published SHA-256).
PUBLISHED = "published"


def source_config(data_dir: os.PathLike | str | None) -> tfds.core.BuilderConfig:
    """The builder config that keys the prepared data by its source.

    `PUBLISHED` for None (the download, checked against `SHA256`) and for a directory whose files have
    the published SHA-256; else ``sha256_<16 hex digits>`` of the SHA-256 of its train.jsonl and
    test.jsonl. Raises `MissingDataError` when the directory or one of the files does not exist.
    """
    if data_dir is None:
        return tfds.core.BuilderConfig(name=PUBLISHED, description="GSM8K's published files")
    paths = local_files(data_dir)
    digests = {split: file_sha256(path) for split, path in paths.items()}
    if digests == dict(SHA256):
        return tfds.core.BuilderConfig(name=PUBLISHED, description="GSM8K's published files")
    key = hashlib.sha256("".join(f"{split}:{digests[split]}\n" for split in sorted(digests)).encode()).hexdigest()
    return tfds.core.BuilderConfig(name=f"sha256_{key[:16]}",
                                   description=f"GSM8K-format files first prepared from {os.path.abspath(data_dir)}")


def local_files(data_dir: os.PathLike | str) -> dict[str, str]:
    """{split: path} of the jsonl files of a local copy; `MissingDataError` names what is missing."""
    if not os.path.isdir(data_dir):
        raise MissingDataError(f"GSM8K data directory {os.path.abspath(data_dir)} does not exist. {HOW_TO_PROVIDE}")
    paths = {split: os.path.join(data_dir, f"{split}.jsonl") for split in URLS}
    missing = [path for path in paths.values() if not os.path.isfile(path)]
    if missing:
        raise MissingDataError(f"GSM8K data directory {os.path.abspath(data_dir)} lacks "
                               f"{', '.join(os.path.basename(m) for m in missing)}. {HOW_TO_PROVIDE}")
    return paths


def check_files(paths: Mapping[str, os.PathLike | str]) -> None:
    """Every line of each file is a GSM8K example and each file holds at least one.

    Run before TFDS prepares them, so a bad file is one `DataError` naming the file and line, not an
    error from inside the preparation (nor an empty split).
    """
    for path in paths.values():
        count = sum(1 for _ in read_jsonl(path))
        if not count:
            raise DataError(f"{path}:1: holds no GSM8K example (the file is empty); give a file with one JSON "
                            'object {"question": ..., "answer": ...} per line')


class Gsm8k(tfds.core.GeneratorBasedBuilder):
    """TFDS builder of GSM8K: downloads the public jsonl files, or reads a local copy (manual dir)."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "First release: question, solution and final answer."}
    MANUAL_DOWNLOAD_INSTRUCTIONS = (
        "Optional. To prepare offline, give a directory as the manual dir. " + HOW_TO_PROVIDE
    )

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description=__doc__.split("\n\n")[0],
            features=tfds.features.FeaturesDict(
                {"question": tfds.features.Text(), "solution": tfds.features.Text(), "answer": tfds.features.Text()}
            ),
            supervised_keys=("question", "answer"),
            homepage="https://github.com/openai/grade-school-math",
            citation="Cobbe et al. 2021, Training Verifiers to Solve Math Word Problems, arXiv:2110.14168",
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        paths = _local_copy(dl_manager)
        if paths is None:
            paths = dl_manager.download(dict(URLS))
            for split, path in paths.items():
                if (digest := file_sha256(path)) != SHA256[split]:
                    raise ValueError(
                        f"GSM8K {split} from {URLS[split]} has SHA-256 {digest}, expected {SHA256[split]}; "
                        "the download is corrupt or the source changed. Delete it and retry, or provide a "
                        "local copy as the manual dir."
                    )
        return {split: self._generate_examples(path) for split, path in paths.items()}

    def _generate_examples(self, path):
        for line_number, example in read_jsonl(path):
            yield line_number, example


def _local_copy(dl_manager: tfds.download.DownloadManager) -> dict[str, os.PathLike] | None:
    """The jsonl files of the manual dir, or None when no manual dir was given."""
    try:
        manual_dir = dl_manager.manual_dir
    except AssertionError:  # TFDS's way of saying "no manual dir, or an empty one".
        return None
    paths = {split: manual_dir / f"{split}.jsonl" for split in URLS}
    missing = [os.fspath(path) for path in paths.values() if not path.exists()]
    if missing:
        raise FileNotFoundError(f"GSM8K manual dir {manual_dir} lacks {', '.join(missing)}. {HOW_TO_PROVIDE}")
    return paths
