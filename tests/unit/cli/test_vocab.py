"""The deprecated long names are rewritten before parsing, and only where they mean something."""

from __future__ import annotations

from pdexporter.cli._vocab import DEPRECATED, rewrite_deprecated

RUN = {"--decode-batch-size", "-D", "--new-prefill-tokens", "-P", "--chunk-size", "-B", "--out"}


def test_old_names_become_the_new_ones_with_one_warning_each() -> None:
    warned: list[str] = []
    args = ["--probe-decode", "4", "--prefill-tokens=512", "--probe-decode", "5", "--out", "x"]
    assert rewrite_deprecated(args, RUN, warned.append) == [
        "--decode-batch-size", "4", "--new-prefill-tokens=512", "--decode-batch-size", "5", "--out", "x"]
    assert warned == [
        "pdexporter: warning: --probe-decode is now --decode-batch-size; the old name goes in the next release",
        "pdexporter: warning: --prefill-tokens is now --new-prefill-tokens; the old name goes in the next release"]


def test_nothing_after_a_double_dash_and_nothing_a_command_lacks_or_owns() -> None:
    warned: list[str] = []
    assert rewrite_deprecated(["--", "--probe-decode"], RUN, warned.append) == ["--", "--probe-decode"]
    # a command without the new name gets the old one as typed (click then says "No such option")
    assert rewrite_deprecated(["--for-decodes", "4"], {"--out"}, warned.append) == ["--for-decodes", "4"]
    # a command that still has an option of the old name keeps it
    assert rewrite_deprecated(["--prefill-tokens", "4"], RUN | {"--prefill-tokens"}, warned.append) == [
        "--prefill-tokens", "4"]
    assert warned == []
    assert set(DEPRECATED.values()) <= RUN
