"""The message-only filter (mutation/messages.py): which mutants change only what a person reads."""

from __future__ import annotations

import ast
import textwrap

import pytest

from mutation.messages import MessageRules, is_message_only, message_only_mutants, plain_name

RULES = MessageRules(message_calls=("SanError 1:", "*Error", "_flag 0:2", "problems.append"),
                     message_keywords=("detail",), message_names=("hint",), message_returns=("__repr__",))

ORIGINAL = '''
def f(x, kind):
    if x < 0:
        raise SanError(WsaError.WSAEINVAL, f"{kind}: negative ({x})")
    if kind == "send":
        raise ValueError("no " + "sends")
    hint = "the hint"
    problems.append("a problem")
    _flag("call", "name", x)
    leak = Leak(kind="allocation", detail="pinned")
    assert x, "x is zero"
    table = {"send": 1}
    return table["send"]
'''


def function(source: str) -> ast.FunctionDef:
    node = ast.parse(textwrap.dedent(source)).body[0]
    assert isinstance(node, ast.FunctionDef)
    return node


def message_only(old: str, new: str, rules: MessageRules = RULES) -> bool:
    assert old in ORIGINAL
    return is_message_only(function(ORIGINAL), function(ORIGINAL.replace(old, new, 1)), rules)


@pytest.mark.parametrize(("old", "new"), [
    ('f"{kind}: negative ({x})"', "None"),  # SanError's message, from its second argument on
    ('f"{kind}: negative ({x})")', "f\"{kind}: negative ({x + 1})\")"),  # inside a message's f-string
    ('"no "', '"XXno XX"'),  # a raised error's text, through +
    ('"sends"', '"SENDS"'),
    ('"the hint"', '"XXthe hintXX"'),  # message_names
    ('problems.append("a problem")', 'problems.append("A PROBLEM")'),
    ('_flag("call", "name", x)', '_flag("call", "XXnameXX", x)'),  # _flag 0:2: the second is a message
    ('detail="pinned"', 'detail="XXpinnedXX"'),  # message_keywords
    ('"x is zero"', '"X IS ZERO"'),  # an assert's message
])
def test_a_change_inside_a_message_is_message_only(old: str, new: str) -> None:
    assert message_only(old, new)


@pytest.mark.parametrize(("old", "new"), [
    ("WsaError.WSAEINVAL", "WsaError.WSAEFAULT"),  # SanError's code is judged
    ("SanError(WsaError.WSAEINVAL, ", "SanError("),  # the code dropped: the message moves into its place
    ('kind == "send"', 'kind == "XXsendXX"'),  # a compared string is data
    ('_flag("call", "name", x)', '_flag("call", "name", None)'),  # _flag's value is no message
    ('kind="allocation"', 'kind="XXallocationXX"'),  # a keyword argument not in message_keywords
    ('table = {"send": 1}', 'table = {"XXsendXX": 1}'),  # a dict key
    ('return table["send"]', 'return table["SEND"]'),
    ("if x < 0:", "if x <= 0:"),  # no string at all
])
def test_a_change_outside_messages_is_counted(old: str, new: str) -> None:
    assert not message_only(old, new)


def test_the_last_argument_dropped_from_a_message_call_is_message_only_but_not_an_earlier_one() -> None:
    assert message_only('_flag("call", "name", x)', '_flag("call", "name")') is False  # x is a value
    rules = MessageRules(message_calls=("_flag",))
    assert message_only('_flag("call", "name", x)', '_flag("call", "name")', rules)
    assert not message_only('_flag("call", "name", x)', '_flag("call", x)', RULES)  # x moved


def test_a_mutant_that_also_changes_logic_is_counted() -> None:
    mutant = ORIGINAL.replace('"no "', '"XXno XX"').replace("if x < 0:", "if x <= 0:")
    assert not is_message_only(function(ORIGINAL), function(mutant), RULES)


def test_what_a_message_function_returns_is_a_message_and_nothing_else_is() -> None:
    original = 'def f(self):\n    return "<thing " + self.name + ">"\n'
    mutant = original.replace("<thing ", "XX<thing XX")
    assert is_message_only(function(original), function(mutant), RULES, "__repr__")
    assert not is_message_only(function(original), function(mutant), RULES, "name")


def test_no_change_at_all_is_not_a_message_mutant() -> None:
    assert not is_message_only(function(ORIGINAL), function(ORIGINAL), RULES)


MUTATED_FILE = '''
def x_g__mutmut_orig(x):
    raise TypeError("bad " + str(x))
def x_g__mutmut_1(x):
    raise TypeError("XXbad XX" + str(x))
def x_g__mutmut_2(x):
    raise ValueError("bad " + str(x))
class C:
    def xǁCǁm__mutmut_orig(self):
        return "<C>"
    def xǁCǁm__mutmut_1(self):
        return "XX<C>XX"
class D:
    def xǁDǁ__repr____mutmut_orig(self):
        return "<D>"
    def xǁDǁ__repr____mutmut_1(self):
        return "XX<D>XX"
'''


def test_the_mutants_of_a_file_mutmut_wrote_are_sorted_by_their_functions() -> None:
    assert message_only_mutants(MUTATED_FILE, RULES) == {"x_g__mutmut_1", "xǁDǁ__repr____mutmut_1"}
    assert plain_name("xǁDǁ__repr__") == "D.__repr__"
    assert plain_name("x_g") == "g"


def test_the_rules_come_from_a_toml_table_and_bad_ones_are_named() -> None:
    assert MessageRules.from_table({"message_calls": ["SanError 1:"]}).message_calls == ("SanError 1:",)
    with pytest.raises(ValueError, match="unknown key 'message_call'"):
        MessageRules.from_table({"message_call": ["x"]})
    with pytest.raises(ValueError, match="message_names must be a list of strings"):
        MessageRules.from_table({"message_names": "hint"})


def test_the_projects_configuration_parses() -> None:
    from mutation.runner import CONFIG, load_config

    pytest.importorskip("tomllib", reason="Python 3.11+ (on 3.10 the runner reads TOML with mutmut's toml)")
    config = load_config(CONFIG)
    ours = dict(config["san-mutation"])
    assert ours.pop("run_together") == ["pytest_san/scenarios/test_model.py::*"]
    assert ours.pop("run_all_tests_for") == ["*ǁ__init__"]
    assert ours.pop("links") == ["tests"]
    assert ours.pop("only_for") == {"tests/pytest_san/test_batch.py::*": "pytest_san.batch.*",
                                    "tests/pytest_san/switch/test_round_trips.py::*": "pytest_san.switch.*",
                                    "tests/pytest_san/spi/test_dma_books.py::*": "pytest_san.spi.dma.*"}
    rules = MessageRules.from_table(ours)
    assert "SanError 1:" in rules.message_calls
    assert config["mutmut"]["pytest_add_cli_args_test_selection"] == [
        "--pyargs", "pytest_san.scenarios", "tests/pytest_san/test_batch.py",
        "tests/pytest_san/switch/test_round_trips.py", "tests/pytest_san/spi/test_dma_books.py"]


def test_the_example_switchs_configuration_parses() -> None:
    from mutation.runner import HERE, load_config

    pytest.importorskip("tomllib", reason="Python 3.11+ (on 3.10 the runner reads TOML with mutmut's toml)")
    config = load_config(HERE / "example_switch.toml")
    assert config["mutmut"]["only_mutate"] == ["pytest_san/examples/simple_switch/*.py"]
    assert config["mutmut"]["pytest_add_cli_args"][:2] == ["-p", "pytest_san.mutants.legal.switch_simple"]
    MessageRules.from_table({k: v for k, v in config["san-mutation"].items() if k != "run_all_tests_for"})


def test_under_a_message_name_only_strings_are_messages() -> None:
    rules = MessageRules(message_names=("problems", "hint"))
    original = '''
def f(d, same):
    problems = [f"{n} is bad: {getattr(d, n)!r}" for n in NAMES if bad(d, n)]
    problems += ["another"]
    hint = f" (at {same[0]:#x})" if same else ""
    if problems:
        raise ValueError("; ".join(problems) + hint)
'''
    def mutated(old: str, new: str) -> bool:
        assert old in original
        return is_message_only(function(original), function(original.replace(old, new, 1)), rules)

    assert mutated("getattr(d, n)", "getattr(None, n)")  # inside the f-string
    assert mutated('["another"]', '["XXanotherXX"]')
    assert mutated("if same else", "if same and False else")  # which text the hint is
    assert not mutated('problems = [f"{n} is bad: {getattr(d, n)!r}" for n in NAMES if bad(d, n)]',
                       "problems = None")  # tested for emptiness: whether it raises
    assert not mutated("if bad(d, n)", "if not bad(d, n)")
