"""What the copy of a mutated module looks like (``tools/mutation/run.py``).

The string literals of exception, warning and log messages are not mutated (see
``message_lines``): their wording is for people, and tests check what a message names.

mutmut 3 never mutates a decorated function (other than ``@staticmethod`` /
``@classmethod``). The registries of ``core_algos`` (``@register_adv_est("grpo")`` ...)
would hide every estimator and loss, so the copy spells those module-level decorators
as an assignment after the function, ``f = register_adv_est("grpo")(f)``, which Python
defines to be the same thing; methods keep their decorators.
"""

from __future__ import annotations


def lift_decorators(source: str) -> str:
    """Module-level ``@d(...) def f`` -> ``def f`` then ``f = d(...)(f)`` (same meaning),
    so mutmut mutates registered functions."""
    import libcst as cst

    module = cst.parse_module(source)
    body = []
    for stmt in module.body:
        if isinstance(stmt, cst.FunctionDef) and stmt.decorators:
            name = stmt.name.value
            applied = name
            for decorator in reversed(stmt.decorators):
                applied = f"({module.code_for_node(decorator.decorator)})({applied})"
            body.append(stmt.with_changes(decorators=[], leading_lines=[
                *stmt.decorators[0].leading_lines, *stmt.leading_lines]))
            body.append(cst.parse_statement(f"{name} = {applied}\n"))
        else:
            body.append(stmt)
    return module.with_changes(body=body).code


# Calls whose string arguments are only text for a person to read.
MESSAGE_CALLS = {"_say", "_warn", "write_line", "warn", "warning", "info", "debug", "error",
                 "exception", "critical", "print"}
MARK = "  # message text: not mutated"
# mutmut skips every expression (with what it contains) that starts on a line matching
# one of do_not_mutate_patterns; a "# pragma: no mutate" would miss a statement's later lines
MARK_PATTERN = r"# message text: not mutated$"


def _call_name(node) -> str:
    func = node.func
    name = getattr(getattr(func, "attr", None), "value", None) or getattr(func, "value", "")
    return name if isinstance(name, str) else ""


def message_lines(source: str) -> set[int]:
    """Lines of the string-literal arguments of exception constructors (``raise E(...)``)
    and of warning, log and print calls, and of implicit string concatenations spanning
    several lines (a sentence split to fit): text for people. Tests check what a message
    names (the file, the step, the field), not its wording; mutating the wording ("XX" +
    s + "XX", upper, lower, the argument dropped) only makes mutants no test should pin
    down. Line-based (mutmut's do_not_mutate_patterns): a behavioural expression sharing
    such a line is skipped too."""
    import libcst as cst
    from libcst.metadata import MetadataWrapper, PositionProvider

    lines: set[int] = set()
    inside_strings: set[int] = set()  # lines a multi-line string continues past

    class Visitor(cst.CSTVisitor):
        METADATA_DEPENDENCIES = (PositionProvider,)

        def _mark(self, call) -> None:
            for arg in call.args:  # the text itself; other arguments are behaviour
                if not isinstance(arg.value, (cst.SimpleString, cst.ConcatenatedString,
                                              cst.FormattedString)):
                    continue
                where = self.get_metadata(PositionProvider, arg)
                lines.update(range(where.start.line, where.end.line + 1))

        def visit_Raise(self, node) -> None:
            if isinstance(node.exc, cst.Call):
                self._mark(node.exc)

        def visit_Call(self, node) -> None:
            if _call_name(node) in MESSAGE_CALLS:
                self._mark(node)

        def visit_ConcatenatedString(self, node) -> None:
            # "..." "..." over several lines: a sentence split to fit the line length
            where = self.get_metadata(PositionProvider, node)
            if where.end.line > where.start.line:
                lines.update(range(where.start.line, where.end.line + 1))

        def _string(self, node) -> None:
            where = self.get_metadata(PositionProvider, node)
            inside_strings.update(range(where.start.line, where.end.line))

        def visit_SimpleString(self, node) -> None:
            self._string(node)

        def visit_FormattedString(self, node) -> None:
            self._string(node)

    MetadataWrapper(cst.parse_module(source)).visit(Visitor())
    return lines - inside_strings


def mark_messages(source: str) -> str:
    """Append ``MARK`` (see ``MARK_PATTERN``) to the lines ``message_lines`` finds."""
    marked = message_lines(source)
    out = []
    for number, line in enumerate(source.splitlines(keepends=True), start=1):
        if number in marked and not line.rstrip().endswith("\\"):
            line = line.rstrip("\n") + MARK + "\n"
        out.append(line)
    return "".join(out)
