"""What the fuzz campaign (`jobreg fuzz`, registry/dev/fuzz.py) found, each kept as a test of
its own through the real entry point (no broker needed)."""

from __future__ import annotations

from click.testing import CliRunner

from registry.cli import main


def _run(*args: str, env: dict | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        repr(result.exception)
    return result.exit_code, result.stderr


def test_a_nul_byte_in_a_file_reference_of_command_config(tmp_path) -> None:
    """Found by `jobreg fuzz --seed 1` (properties): `${file:...}` with a NUL byte in its path
    raised ValueError: embedded null byte."""
    props = tmp_path / "client.properties"
    props.write_bytes(b"sasl.password=${file:/tmp/se\x00cret}\n")
    code, err = _run("--command-config", str(props), "jobs")
    assert code == 2 and "Traceback" not in err
    assert err.rstrip().splitlines()[-1] == (
        f"Error: Invalid value for --command-config: {props}:1: sasl.password refers to the "
        "file '/tmp/se\\x00cret', which cannot be read (its name holds a NUL byte)")


def test_a_nul_byte_in_an_env_reference_of_command_config(tmp_path) -> None:
    props = tmp_path / "client.properties"
    props.write_bytes(b"sasl.password=${env:SE\x00CRET}\n")
    code, err = _run("--command-config", str(props), "jobs")
    assert code == 2 and "Traceback" not in err
    assert "refers to the environment variable" in err.rstrip().splitlines()[-1]
