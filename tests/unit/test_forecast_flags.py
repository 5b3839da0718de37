"""Every flag of `scalelab plan` and of each `scalelab estimate` subcommand, given a bad value (negative, zero,
inf, nan, not a number, a missing file, an unknown name), is refused with one error line naming the flag and exit
status 2, and no traceback: the parsers are walked, so a flag added later is walked too. In process (unit tier)."""
import argparse
import functools

import pytest

from scalelab.cli import main
from scalelab.forecast.estimate_command import add_parser as add_estimate
from scalelab.forecast.plan import add_parser as add_plan

PRESET = ["--model", "llama3.2-1b"]
SHAPE = {"--layers": "2", "--d-model": "64", "--vocab": "256", "--seq": "64"}
VALID = {  # a command each subcommand answers (exit 0), the model apart
    ("estimate", "memory"): ["--world-size", "8", "--micro-batch", "1"],
    ("estimate", "time"): ["--tokens", "1T", "--gpus", "8", "--gpu", "H100"],
    ("estimate", "fit"): ["--gpu-memory", "80", "--world-size", "8"],
    ("estimate", "advise"): ["--gpus", "8", "--gpu-memory", "80", "--micro-batch", "1"],
    ("estimate", "claim"): ["--tokens-per-s", "1M", "--gpus", "8", "--gpu", "H100"],
    ("estimate", "models"): [],
    ("estimate", "links"): [],
    ("estimate", "scaling"): ["--zero-stage", "1", "--gpu", "H100", "--inter-node", "ib-ndr", "--gpus", "8,16"],
    ("plan",): ["--gpus", "16", "--gpu", "H100", "--inter-node", "ib-ndr", "--global-batch", "64", "--tokens", "1B"],
}
NUMBERS = ["-4", "0", "inf", "nan", "abc"]
NAMES = ["no-such-thing", "missing.yaml"]  # files, links, GPUs, presets: none of them exists
ACCEPTED = {("--reserve-gib", "0"), ("--overlap-efficiency", "0"), ("--zero-stage", "0")}
"""Bad elsewhere, right here: no reserve, no overlap at all, and ZeRO stage 0 (DDP) are things a user may ask for."""
FILES_OR_NAMES = {"--config", "--mfu-from", "--intra-node", "--inter-node", "--gpu", "--model"}


@functools.cache
def _parsers() -> dict[tuple, argparse.ArgumentParser]:
    top = argparse.ArgumentParser(prog="scalelab")
    sub = top.add_subparsers(dest="command")
    add_estimate(sub)
    add_plan(sub)
    kinds = next(a for a in sub.choices["estimate"]._actions if isinstance(a, argparse._SubParsersAction))
    return {("plan",): sub.choices["plan"], **{("estimate", k): p for k, p in kinds.choices.items()}}


def _cases():
    for command, parser in _parsers().items():
        for action in parser._actions:
            flag = next((o for o in action.option_strings if o.startswith("--")), None)
            if flag in (None, "--help") or action.nargs == 0:
                continue
            values = NAMES if flag in FILES_OR_NAMES else NUMBERS
            for value in values:
                if (flag, value) not in ACCEPTED:
                    yield pytest.param(command, flag, value, id=f"{' '.join(command)} {flag} {value}")


def _command(command: tuple, flag: str, value: str) -> list[str]:
    """The subcommand's valid command with ``flag`` set to ``value`` (the model given as the shape where the flag
    is one of the shape's, by ``flag`` alone where it names the model)."""
    rest, model = list(VALID[command]), []
    if "--model" in parser_flags(command):
        if flag in SHAPE or flag == "--heads":
            model = [x for k, v in SHAPE.items() for x in (k, value if k == flag else v)]
            return [*command, *model, *(["--heads", value] if flag == "--heads" else []), *rest]
        if flag not in ("--params", "--config", "--model"):
            model = PRESET
    if flag in rest:  # the flag replaces its valid value
        rest[rest.index(flag) + 1] = value
    else:
        rest += [flag, value]
    return [*command, *model, *rest]


@functools.cache
def parser_flags(command: tuple) -> frozenset[str]:
    return frozenset(o for a in _parsers()[command]._actions for o in a.option_strings)


def _run(argv: list[str], capsys) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exited:
        code = exited.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("command", list(VALID), ids=[" ".join(c) for c in VALID])
def test_each_base_command_answers(command, capsys):
    model = PRESET if "--model" in parser_flags(command) else []
    code, err = _run([*command, *model, *VALID[command]], capsys)
    assert code == 0, err


@pytest.mark.parametrize("command, flag, value", list(_cases()))
def test_a_bad_value_is_one_line_naming_the_flag_and_exit_2(command, flag, value, capsys):
    argv = _command(command, flag, value)
    code, err = _run(argv, capsys)
    assert "Traceback" not in err
    # argparse's usage lines may come first: its "usage:" and the lines it indents under it
    lines = [line for line in err.splitlines() if line and not line.startswith(("usage:", " "))]
    assert code == 2 and len(lines) == 1, (argv, err)
    assert "error:" in lines[0] and flag in lines[0], (argv, lines[0])


PLAN = ["plan", "--model", "llama3.2-1b", "--gpus", "16", "--gpu", "H100", "--inter-node", "ib-ndr", "--global-batch", "64",
        "--tokens", "1B"]


@pytest.mark.parametrize("argv", [
    [*PLAN, "--gpus", "0"], [*PLAN, "--gpus", "-4"], [*PLAN, "--tensor-parallel", "0"], [*PLAN, "--tensor-parallel=-2"],
    [*PLAN, "--global-batch", "0"], [*PLAN, "--global-batch=-8"], [*PLAN, "--seq", "0"], [*PLAN, "--tokens", "-1B"],
    [*PLAN, "--tokens", "0"], [*PLAN, "--tokens", "inf"], [*PLAN, "--reserve-gib", "-5"], [*PLAN, "--reserve-gib", "80"],
    ["plan", "--config", "missing.yaml", *PLAN[3:]], ["estimate", "memory", "--config", "missing.yaml"],
    [*PLAN, "--params", "1B"],
], ids=lambda argv: " ".join(argv[-2:]))
def test_the_refusals_a_user_met_are_one_line_with_exit_2(argv, capsys):
    code, err = _run(argv, capsys)
    lines = [line for line in err.splitlines() if line and not line.startswith(("usage:", " "))]
    assert code == 2 and len(lines) == 1 and "error:" in lines[0] and "Traceback" not in err, err
