import subprocess
import sys
from pathlib import Path

import pytest

from trioloop.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "payment.thf"
INVALID = Path(__file__).resolve().parent / "fixtures" / "thf_invalid"


def test_valid_file_prints_one_summary_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(EXAMPLE)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.count("\n") == 1
    assert "valid .thf 1.0" in out
    for count in ("12 elements", "12 data_flows", "2 trust_boundaries", "7 threats", "3 layers", "3 groups"):
        assert count in out


@pytest.mark.parametrize(
    ("fixture", "error"),
    [
        ("duplicate_element_id", "DuplicateId"),
        ("dangling_flow_source", "InvalidReference"),
        ("unsupported_version", "UnsupportedVersion"),
        ("billion_laughs", "UnsafeYaml"),
        ("group_cycle", "CircularGroupNesting"),
        ("field_wrong_type", "InvalidShape"),
    ],
)
def test_invalid_file_exits_1_with_the_error_class(
    fixture: str, error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", str(INVALID / f"{fixture}.thf")]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"error: {error}: ") and err.count("\n") == 1
    assert str(INVALID) not in err  # the message never carries the path


def test_unreadable_file_and_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(tmp_path / "missing.thf")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["validate", str(tmp_path)]) == 2
    assert main(["validate"]) == 2
    assert main([]) == 2
    assert main(["no-such-command"]) == 2


def run_module(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trioloop", *args], capture_output=True, text=True, cwd=ROOT, timeout=60, check=False
    )


def test_python_dash_m_validate() -> None:
    ok = run_module("validate", "examples/payment.thf")
    assert ok.returncode == 0 and "12 elements" in ok.stdout
    bad = run_module("validate", "tests/fixtures/thf_invalid/dangling_threat_flow.thf")
    assert bad.returncode == 1
    assert bad.stderr.strip() == 'error: InvalidReference: threats["t1"].flow: no data flow with id "f9"'
    assert run_module("validate", "does/not/exist.thf").returncode == 2


@pytest.mark.parametrize("command", [["demo", "--approve", "none"], ["chat", "--provider", "anthropic"]])
def test_demo_and_chat_exit_as_validate_does_for_a_bad_document(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """1 for a file that is not a valid document, 2 for one that cannot be read (validate's statuses)."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-not-used")  # the document is read before any request
    invalid = tmp_path / "invalid.thf"
    invalid.write_text("version: '9.9'\n", encoding="utf-8")
    assert main([command[0], str(invalid), *command[1:]]) == 1
    assert "UnsupportedVersion" in capsys.readouterr().err
    assert main([command[0], str(tmp_path / "missing.thf"), *command[1:]]) == 2
    assert "cannot read missing.thf" in capsys.readouterr().err
