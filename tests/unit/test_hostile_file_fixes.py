"""One case each of what tests/e2e/test_hostile_files.py found (issue 57): each was a traceback or a silently wrong
reading before its fix; now the reader gives the file's contents or refuses it in one line naming the file."""
import json
import struct

import numpy as np
import pytest

from rn50kit.config import cli, config_files
from rn50kit.config import recipe as recipes
from rn50kit.data import records
from rn50kit.reliability import run_lock
from rn50kit.scoring import predict
from rn50kit.weights import checkpoint, pretrained

DEEP = "[" * 100000 + "]" * 100000  # past Python's recursion limit


def test_a_state_file_nested_too_deep_is_a_damaged_checkpoint(tmp_path):
    path = tmp_path / "model-0001.state.json"
    path.write_text('{"epoch": 1, "step": 0, "files": {}, "x": ' + DEEP + "}")
    state, why = checkpoint.inspect(str(path))
    assert state is None and why == f"{path} is damaged (not valid JSON)"


@pytest.mark.parametrize("text", ["[1, 2]", '{"pid": 7, "started": "yesterday"}', DEEP])
def test_a_run_lock_that_is_no_record_reads_as_none_and_describes_without_error(tmp_path, text):
    (tmp_path / "run.lock").write_text(text)
    record = run_lock.run_state(str(tmp_path))
    assert record == ({"pid": 7, "started": "yesterday"} if text.startswith("{") else {})
    assert "workspace" in run_lock.busy_message(str(tmp_path), record)
    if record:
        assert run_lock.describe(record) == "pid 7 on host ? (started ?)"


@pytest.mark.parametrize("length", [2 ** 64 - 1, 10 ** 12])
def test_a_safetensors_header_length_past_the_end_is_refused(tmp_path, length):
    path = tmp_path / "w.safetensors"
    header = json.dumps({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    path.write_bytes(struct.pack("<Q", length) + header + np.ones(2, np.float32).tobytes())
    with pytest.raises(pretrained.PretrainedError, match=f"--pretrained {path} is not a readable safetensors"):
        pretrained.read_weights(str(path))


def test_a_safetensors_header_entry_that_is_not_an_object_is_refused(tmp_path):
    path = tmp_path / "w.safetensors"
    header = json.dumps({"a": [1, 2]}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    with pytest.raises(pretrained.PretrainedError, match=str(path)):
        pretrained.read_weights(str(path))


def test_an_index_offset_past_int64_is_a_bad_line(tmp_path):
    path = tmp_path / "a.idx"
    path.write_text("0\t0\n1\t99999999999999999999999\n")  # numpy's parser read it as 2**63 - 1
    with pytest.raises(records.RecordFileError, match=r"a\.idx: index line 2 is not"):
        records.read_index_arrays(str(path))


def test_a_class_name_list_not_in_utf8_is_refused_naming_the_line(tmp_path):
    path = tmp_path / "names.txt"
    path.write_bytes(b"cat\ndog\n\xff\xfebird\n")
    with pytest.raises(cli.UsageError, match=f"class names {path} line 3 is not UTF-8 text"):
        predict.read_names_file(str(path))
    path.write_bytes("cat\r\n\nchien\u00e9\n".encode())
    assert predict.read_names_file(str(path)) == ["cat", "chien\u00e9"]


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "[1.0, inf]"])
def test_nan_and_infinity_in_a_config_file_are_refused(tmp_path, value):
    from train import get_args_parser
    path = tmp_path / "c.toml"
    path.write_text(f"batch_size = 64\n{'lr_steps' if value.startswith('[') else 'wd'} = {value}\n")
    with pytest.raises(config_files.ConfigError, match=f"{path} line 2: .*expected a finite number"):
        config_files.check_against(config_files.read(str(path)), get_args_parser())


def test_a_config_file_nested_too_deep_is_refused(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(f"lr_steps = {DEEP}\n")
    with pytest.raises(config_files.ConfigError, match=f"{path}: arrays or tables nested too deeply"):
        config_files.read(str(path))


def test_an_infinite_lr_per_256_in_a_recipe_is_refused(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text("lr_per_256 = inf\nnum_epochs = 3\n")
    with pytest.raises(config_files.ConfigError, match="lr_per_256 = inf: expected a positive number"):
        recipes.load_recipe(str(path))
