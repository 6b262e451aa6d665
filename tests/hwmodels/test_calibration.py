import os

import pytest
import yaml

from hwmodels import Calibration, CalibrationRun, get_gpu, kernel_time_s, list_gpus, load_calibration, save_calibration


def _cal(**over) -> Calibration:
    fields = dict(
        version=1, gpu="h200", created_utc="2026-11-30T12:00:00Z",
        runs=[CalibrationRun(run_id="r1", scenario="gem-h200-1gpu", source_path="runs/r1/record.json",
                             n_steps=50, step_time_s=0.412)],
        scale={"gemm": 0.95, "attention": 1.2}, notes="fit on one run")
    return Calibration(**(fields | over))


def _files(folder) -> list[str]:
    return sorted(os.listdir(folder))


def test_round_trip(tmp_path):
    path = tmp_path / "cal.yaml"
    save_calibration(_cal(), path)
    assert load_calibration(path) == _cal()
    assert _files(tmp_path) == ["cal.yaml"]  # no temp file left


def test_scale_feeds_kernel_time(tmp_path):
    path = tmp_path / "cal.yaml"
    save_calibration(_cal(), path)
    args = dict(op_class="attention", flops=1e12, bytes=1e9, gpu=get_gpu("h200"), dtype="bf16")
    assert kernel_time_s(scale=load_calibration(path).scale, **args) == pytest.approx(1.2 * kernel_time_s(**args))


def test_invalid_calibration_leaves_old_file_untouched(tmp_path):
    path = tmp_path / "cal.yaml"
    save_calibration(_cal(), path)
    before = path.read_bytes()
    bad = Calibration.model_construct(**(_cal().__dict__ | {"scale": {"gemm": -1.0}}))
    with pytest.raises(ValueError) as e:
        save_calibration(bad, path)
    assert str(e.value).startswith(f"calibration for {str(path)!r}: scale.gemm = -1.0: Input should be greater than 0")
    assert path.read_bytes() == before and _files(tmp_path) == ["cal.yaml"]


def test_failed_write_leaves_old_file_untouched(tmp_path, monkeypatch):
    path = tmp_path / "cal.yaml"
    save_calibration(_cal(), path)
    before = path.read_bytes()

    def broken_dump(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(yaml, "safe_dump", broken_dump)
    with pytest.raises(OSError, match="disk full"):
        save_calibration(_cal(notes="new"), path)
    assert path.read_bytes() == before and _files(tmp_path) == ["cal.yaml"]


def test_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(ValueError) as e:
        load_calibration(path)
    assert str(e.value) == f"calibration file {str(path)!r} not found; run `gemtwin calibrate` or fix the path"


def test_bad_version(tmp_path):
    path = tmp_path / "cal.yaml"
    path.write_text(yaml.safe_dump(_cal().model_dump() | {"version": 3}))
    with pytest.raises(ValueError) as e:
        load_calibration(path)
    assert str(e.value) == (f"calibration file {str(path)!r}: version 3 is not supported (supported: 1, 2); "
                            "re-fit with `gemtwin calibrate`")


@pytest.mark.parametrize(("change", "message"), [
    ({"scale": {"matmul": 1.0}}, "scale = {'matmul': 1.0}: Value error, scale key 'matmul' is neither an "
     "op class"),
    ({"gpu": "h300"}, f"gpu = 'h300': Value error, unknown GPU 'h300'; known: {', '.join(list_gpus())}"),
    ({"created_utc": "2026-11-30T12:00:00+01:00"}, "created_utc = '2026-11-30T12:00:00+01:00': Value error, "),
    ({"runs": []}, "runs = []: List should have at least 1 item"),
    ({"extra": 1}, "extra = 1: Extra inputs are not permitted"),
])
def test_bad_content_is_one_line(tmp_path, change, message):
    path = tmp_path / "cal.yaml"
    path.write_text(yaml.safe_dump(_cal().model_dump() | change))
    with pytest.raises(ValueError) as e:
        load_calibration(path)
    assert str(e.value).startswith(f"calibration file {str(path)!r}: {message}")
    assert "\n" not in str(e.value)


def test_not_yaml_or_not_a_mapping(tmp_path):
    path = tmp_path / "cal.yaml"
    path.write_text("version: [1\n")
    with pytest.raises(ValueError, match=r"is not valid YAML \(") as e:
        load_calibration(path)
    assert "\n" not in str(e.value)
    path.write_text("- 1\n")
    with pytest.raises(ValueError, match=r"expected a mapping with `version: 2`, got list$"):
        load_calibration(path)


def test_version_2_fields_round_trip_and_feed_the_kernel_model(tmp_path):
    path = tmp_path / "cal2.yaml"
    cal = _cal(version=2, efficiency={"gemm": {"compute_eff_max": 0.5}},
               collective_scale={"nvlink/all_reduce": 1.1}, fit_error={"r1": 0.021})
    save_calibration(cal, path)
    back = load_calibration(path)
    assert back == cal
    args = dict(kind="gemm", flops=1e15, bytes=0, gpu=get_gpu("h200"), dtype="bf16")
    assert kernel_time_s(model=back.kernel_model(), **args) > 1.4 * kernel_time_s(**args)


def test_version_1_file_stays_version_1(tmp_path):
    path = tmp_path / "cal.yaml"
    save_calibration(_cal(), path)
    assert "collective_scale" not in path.read_text()
    old = tmp_path / "v1.yaml"  # a file written before version 2 existed still loads
    old.write_text("version: 1\ngpu: h200\ncreated_utc: '2026-11-30T06:06:43Z'\nruns:\n"
                   "- {run_id: f99c4bf2059a, scenario: gem-h200-1gpu, source_path: run.json, "
                   "n_steps: 12, step_time_s: 0.39}\nscale: {gemm: 1.19}\noverhead_s: 0.066\n")
    ref = load_calibration(old)
    assert ref.version == 1 and ref.efficiency == {} and ref.scale["gemm"] == 1.19


@pytest.mark.parametrize(("change", "message"), [
    ({"collective_scale": {"nvlink/all_reduce": 1.1}}, "(top level) = "),
    ({"version": 2, "collective_scale": {"all_reduce": 1.1}}, "collective_scale = {'all_reduce': 1.1}: Value error, "
     "collective_scale key 'all_reduce' is not 'tier/kind'"),
    ({"version": 2, "efficiency": {"matmul": {"compute_eff_max": 0.5}}}, "efficiency = "),
])
def test_bad_version_2_content_is_one_line(tmp_path, change, message):
    path = tmp_path / "cal.yaml"
    path.write_text(yaml.safe_dump(_cal().model_dump() | change))
    with pytest.raises(ValueError) as e:
        load_calibration(path)
    assert str(e.value).startswith(f"calibration file {str(path)!r}: {message}")
    assert "\n" not in str(e.value)
    if "version" not in change:
        assert "need version: 2 (this file says version: 1); set version: 2" in str(e.value)
