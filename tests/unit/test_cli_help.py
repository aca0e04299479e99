"""Every option and argument of every `fleetbench` subcommand says what it is for in --help, and an error
names the value the user gave once."""

from __future__ import annotations

import argparse

import pytest

from fleetbench.cli import build_parser, main


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, parser) for the parser and every subcommand below it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, (*path, name))


def undocumented(parser: argparse.ArgumentParser) -> list[str]:
    """`fleetbench <command> <option>` for every option or argument without help text."""
    missing = []
    for path, sub in commands(parser):
        for action in sub._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if not action.help or action.help == argparse.SUPPRESS:
                missing.append(f"fleetbench {' '.join(path)} {'/'.join(action.option_strings) or action.dest}")
    return missing


def test_every_option_has_help():
    parser = build_parser()
    assert {"config check", "results", "parse", "host-check", "pools export", "compare", "report",
            "db upgrade"} <= {" ".join(path) for path, _ in commands(parser)}
    assert undocumented(parser) == []


def test_the_walk_finds_an_option_without_help():
    parser = build_parser()
    results = dict(commands(parser))[("results",)]
    results.add_argument("--undocumented")
    results.add_argument("where")
    assert undocumented(parser) == ["fleetbench results --undocumented", "fleetbench results where"]


def test_help_shows_each_subcommands_options(capsys):
    with pytest.raises(SystemExit):
        main(["results", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--run-id RUN_ID this run's results (default: the latest run)" in out


def test_a_bad_revision_is_named_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", f"sqlite:///{tmp_path}/w.db")
    assert main(["db", "upgrade", "--revision", "zzz9"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fleetbench db: --revision") and err.count("zzz9") == 1, err
