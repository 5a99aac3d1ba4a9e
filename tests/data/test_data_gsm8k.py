"""The GSM8K builder: offline from ../shared/data/gsm8k, the download path, and bad input."""

import functools
import http.server
import json
import os
import re
import sys
import threading

import pytest

from jaxgrpo.data import get_task, gsm8k


def gsm8k_dir(shared_dir):
    return os.path.join(shared_dir, "data", "gsm8k")


@pytest.fixture(scope="session")
def gsm8k_task(tmp_path_factory, shared_dir):
    """GSM8K prepared once per session from the local copy (test_rewards_gsm8k.py reuses the directory)."""
    task = get_task("gsm8k", tfds_data_dir=str(tmp_path_factory.getbasetemp() / "tfds_gsm8k"))
    task.load("test", data_dir=gsm8k_dir(shared_dir))
    return task


@pytest.fixture
def serve_directory(monkeypatch):
    """Serves a directory over HTTP on 127.0.0.1 and points the builder's URLs at it."""
    servers = []

    def serve(directory):
        handler = functools.partial(_QuietHandler, directory=str(directory))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        base = f"http://127.0.0.1:{server.server_address[1]}"
        monkeypatch.setattr(gsm8k, "URLS", {split: f"{base}/{split}.jsonl" for split in ("train", "test")})
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")

    yield serve
    for server in servers:
        server.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_offline_copy_gives_the_published_split_sizes(gsm8k_task, shared_dir):
    for split, size in gsm8k.SPLIT_SIZES.items():
        examples = gsm8k_task.load(split, data_dir=gsm8k_dir(shared_dir))
        assert len(examples) == size
    assert "tensorflow" not in sys.modules


def test_examples_hold_question_solution_and_numeric_final_answer(gsm8k_task):
    examples = gsm8k_task.load("test")  # Prepared already: no data_dir needed to read it back.
    for example in examples[:200]:
        assert set(example) == {"question", "solution", "answer"}
        assert example["question"].strip()
        assert re.fullmatch(r"-?\d+", example["answer"]), example["answer"]
        assert example["solution"].rstrip().endswith(example["solution"].rsplit("####", 1)[1].strip())


def test_final_answer_drops_thousands_separators():
    assert gsm8k.final_answer("Some work <<2*600=1200>>\n#### 1,200") == "1200"


def test_num_examples_keeps_the_first_examples(gsm8k_task):
    head = gsm8k_task.load("test", num_examples=5)
    assert len(head) == 5
    assert head[:] == gsm8k_task.load("test")[:5]


def write_small_copy(directory, monkeypatch=None):
    """A 3 + 2 example GSM8K in ``directory``; with ``monkeypatch``, its digests become the expected ones."""
    directory.mkdir()
    for split, size in (("train", 3), ("test", 2)):
        lines = [json.dumps({"question": f"{i} + {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"}) for i in range(size)]
        (directory / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    if monkeypatch is not None:
        monkeypatch.setattr(gsm8k, "SHA256", {s: gsm8k.file_sha256(directory / f"{s}.jsonl") for s in ("train", "test")})


def test_the_published_files_have_the_expected_checksums(shared_dir):
    for split, digest in gsm8k.SHA256.items():
        assert gsm8k.file_sha256(os.path.join(gsm8k_dir(shared_dir), f"{split}.jsonl")) == digest


def test_the_builder_downloads_from_its_source_url(tmp_path, serve_directory, monkeypatch):
    write_small_copy(tmp_path / "source", monkeypatch)
    serve_directory(tmp_path / "source")
    task = get_task("gsm8k", tfds_data_dir=str(tmp_path / "tfds"))
    test = task.load("test")  # No data_dir: the download path.
    assert len(test) == 2 and len(task.load("train")) == 3
    assert sorted(e["answer"] for e in test) == ["0", "2"]
    assert list((tmp_path / "tfds" / "downloads").rglob("*test*.jsonl"))


def test_a_download_with_the_wrong_checksum_is_refused(tmp_path, serve_directory):
    write_small_copy(tmp_path / "source")  # The real SHA-256s stay expected.
    serve_directory(tmp_path / "source")
    with pytest.raises(ValueError, match="GSM8K (train|test) from .* has SHA-256"):
        get_task("gsm8k", tfds_data_dir=str(tmp_path / "tfds")).load("test")


def test_a_missing_data_directory_names_the_path_and_the_fix(tmp_path):
    missing = tmp_path / "no_such_dir"
    with pytest.raises(FileNotFoundError) as error:
        get_task("gsm8k", tfds_data_dir=str(tmp_path / "tfds")).load("train", data_dir=str(missing))
    assert str(missing) in str(error.value)
    assert "train.jsonl and test.jsonl" in str(error.value) and gsm8k.SOURCE_URL in str(error.value)


def test_a_data_directory_without_the_files_names_them(tmp_path):
    (tmp_path / "partial").mkdir()
    (tmp_path / "partial" / "train.jsonl").write_text("")
    with pytest.raises(FileNotFoundError, match=r"lacks .*test\.jsonl"):
        get_task("gsm8k", tfds_data_dir=str(tmp_path / "tfds")).load("train", data_dir=str(tmp_path / "partial"))


@pytest.mark.parametrize(
    "bad_line, reason",
    [
        ("{not json", "Expecting property name"),
        (json.dumps({"question": "q"}), "keys 'question' and 'answer'"),
        (json.dumps({"question": "q", "answer": "no marker"}), "no '####'"),
    ],
)
def test_a_malformed_line_names_the_file_and_line(tmp_path, bad_line, reason):
    good = json.dumps({"question": "1+1?", "answer": "1+1=2\n#### 2"})
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join([good, good, bad_line, good]) + "\n")
    with pytest.raises(ValueError, match=re.escape(f"{path}:3: malformed GSM8K example") + ".*" + re.escape(reason)):
        list(gsm8k.read_jsonl(path))


def test_preparing_from_a_malformed_copy_names_the_file_and_line(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    (source / "train.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n{oops\n")
    (source / "test.jsonl").write_text(json.dumps({"question": "2+2?", "answer": "#### 4"}) + "\n")
    with pytest.raises(ValueError, match=re.escape(f"{source / 'train.jsonl'}:2")):
        get_task("gsm8k", tfds_data_dir=str(tmp_path / "tfds")).load("train", data_dir=str(source))


def _copy_of(directory, train_lines, test_lines):
    directory.mkdir()
    (directory / "train.jsonl").write_text("".join(train_lines))
    (directory / "test.jsonl").write_text("".join(test_lines))
    return str(directory)


def test_another_data_dir_is_prepared_again_and_the_same_files_reuse_their_preparation(gsm8k_task, shared_dir,
                                                                                        tmp_path):
    """Prepared data is keyed by its source: once the full GSM8K is prepared in a TFDS data dir, 20 other
    examples from another data_dir are those 20, not the first preparation's; the same files (also copied
    elsewhere) reuse theirs, and the published preparation stays what it was."""
    with open(os.path.join(gsm8k_dir(shared_dir), "train.jsonl")) as f:
        full_train = f.readlines()
    with open(os.path.join(gsm8k_dir(shared_dir), "test.jsonl")) as f:
        full_test = f.readlines()
    twenty = _copy_of(tmp_path / "twenty", full_train[-20:], full_test[:3])
    assert len(gsm8k_task.load("train", data_dir=gsm8k_dir(shared_dir))) == gsm8k.SPLIT_SIZES["train"]

    subset = gsm8k_task.load("train", data_dir=twenty)
    assert len(subset) == 20
    assert sorted(e["question"] for e in subset) == sorted(json.loads(line)["question"] for line in full_train[-20:])
    five = _copy_of(tmp_path / "five", full_train[:5], full_test[:2])
    assert len(gsm8k_task.load("train", data_dir=five)) == 5
    assert len(gsm8k_task.load("test", data_dir=five)) == 2

    prepared = os.path.join(gsm8k_task.tfds_data_dir, "gsm8k")
    configs = sorted(os.listdir(prepared))
    assert gsm8k.PUBLISHED in configs and len(configs) == 3, configs
    same_files = _copy_of(tmp_path / "twenty_again", full_train[-20:], full_test[:3])
    assert len(gsm8k_task.load("train", data_dir=same_files)) == 20
    assert len(gsm8k_task.load("train", data_dir=twenty)) == 20
    assert sorted(os.listdir(prepared)) == configs  # nothing prepared again
    assert len(gsm8k_task.load("train")) == gsm8k.SPLIT_SIZES["train"]  # no data_dir: the published files


@pytest.mark.parametrize("train, line", [
    ("", 1),                                                    # an empty file
    ("\n\n", 1),                                                # blank lines only
    (json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n" + '{"question": "2+2?"}\n', 2),
])
def test_an_empty_or_malformed_file_is_a_one_line_error_naming_the_file_and_line(tmp_path, train, line):
    source = _copy_of(tmp_path / "source", [train], [json.dumps({"question": "2+2?", "answer": "#### 4"}) + "\n"])
    task = get_task("gsm8k", tfds_data_dir=str(tmp_path / "tfds"))
    with pytest.raises(ValueError) as error:
        task.load("train", data_dir=source)
    assert type(error.value).__name__ == "DataError"  # one of the errors the console scripts print in one line
    message = str(error.value)
    assert message.startswith(f"{os.path.join(source, 'train.jsonl')}:{line}: ") and "\n" not in message, message
    assert not (tmp_path / "tfds" / "gsm8k").exists() or not any((tmp_path / "tfds" / "gsm8k").rglob("*.array_record*"))
