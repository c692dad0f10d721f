"""The `__global__` functions a CUDA C++ source defines, and their parameters' launch codes, read from the text.

A kernel called from Python gets its arguments packed by these codes: 'p' any pointer, 'i' int32 (int, signed,
int32_t), 'u' uint32 (unsigned, uint32_t), 'l' int64 (long long, int64_t, ptrdiff_t, and long: LP64), 'q' uint64
(unsigned long long, uint64_t, size_t, unsigned long), 'f' float, 'd' double; None for any other type (char,
short, bool, half, a struct by value, a template parameter, a reference), which Python cannot pass.

This is a reader of declarations, not a compiler: comments and string/char literals are blanked first, and
preprocessor lines are skipped, so a kernel whose declaration is spelled by a macro is not seen. Overloads (two
definitions of one name) are kept as the first one's signature with `overloaded=True`, so that a launch by that
name can be refused as ambiguous. `clean` and `definitions` are public for the emulator, which scans the same
text for constructs it cannot run and needs the function bodies to name the kernel using one.
"""
import re
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Param:
    """One kernel parameter: `ctype` is its type as normalised text ("const float *"), `kind` its launch code."""
    name: str
    ctype: str
    kind: str | None


@dataclass(frozen=True)
class KernelSignature:
    """A `__global__` function: `scope` holds its enclosing namespaces ("a::b"), `line` is where it is defined."""
    name: str
    params: tuple
    extern_c: bool
    template: bool
    scope: str = ""
    line: int = 0
    overloaded: bool = False

    @property
    def kinds(self):
        """The launch codes as one string ("ppfi"), or None where Python cannot launch it: a template, an
        overloaded name, or a parameter of a type without a code."""
        if self.template or self.overloaded or any(p.kind is None for p in self.params):
            return None
        return "".join(p.kind for p in self.params)


@dataclass(frozen=True)
class Definition:
    """A `__global__` or `__device__` function definition: offsets into the cleaned text, its body's braces
    included."""
    qualifier: str
    name: str
    scope: str
    line: int
    start: int
    params: tuple  # (offset after "(", offset of ")")
    body: tuple  # (offset of "{", offset of "}")
    extern_c: bool
    template: bool


_LITERALS = re.compile(r"""//[^\n]*|/\*.*?\*/"""
                       r"""|(?:\bu8|\b[uUL])?R"([^()\\\s]{0,16})\(.*?\)\1\""""
                       r"""|(?:\bu8|\b[uUL])?"(?:\\.|[^"\\\n])*\""""
                       r"""|(?:(?<![\w.])|(?<=\b[LuU])|(?<=\bu8))'(?:\\.|[^'\\\n])+'""", re.S)
_DIRECTIVE = re.compile(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", re.M)
_QUALIFIER = re.compile(r"\b(__global__|__device__)\b")
_STOP = re.compile(r"[(;{}=]")
_CALLEE = re.compile(r"(::\s*)?([A-Za-z_]\w*(?:\s*::\s*[A-Za-z_]\w*)*)\s*$")
_BODY = re.compile(r"\s*\{")
_BRACKET = re.compile(r"[()\[\]{}]")
_ATTRIBUTES = {"__launch_bounds__", "__attribute__", "__declspec", "alignas", "__align__", "__maxnreg__"}
_BLOCK = re.compile(r"""\bextern\s*"C"\s*\{|\b(?:inline\s+)?namespace\b\s*([A-Za-z_][\w:\s]*?)?\s*\{""")
_TOKEN = re.compile(r"[A-Za-z_]\w*|::|&&|[*&]|\[[^\]]*\]|<|\S")
_QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict", "restrict", "register"}
_ELABORATED = {"struct", "class", "enum", "union", "typename"}
_TYPE_WORDS = {"int", "unsigned", "signed", "long", "short", "char", "float", "double", "bool", "void", "auto"}
_BUILTIN = {"unsigned", "signed", "int", "long", "short", "char"}
_NAMED = {"float": "f", "double": "d", "int32_t": "i", "uint32_t": "u", "int64_t": "l", "uint64_t": "q",
          "size_t": "q", "ptrdiff_t": "l", "intptr_t": "l", "uintptr_t": "q", "ssize_t": "l"}


def clean(source):
    """`source` with comments and the insides of string and char literals blanked (newlines kept), so offsets and
    line numbers still match the original; `"C"` is kept, for `extern "C"`."""
    def blank(match):
        text = match.group(0)
        if text == '"C"':
            return text
        if text[0] == "/":
            return re.sub(r"[^\n]", " ", text)
        quote = re.search("[\"']", text).start()  # after a prefix: u8, u, U, L, R
        inner = re.sub(r"[^\n]", " ", text[quote + 1:-1])
        return " " * quote + text[quote] + inner + text[-1]
    return _LITERALS.sub(blank, source)


def parse(source):
    """{name: KernelSignature} of every `__global__` function defined in `source`. extern "C" kernels are named as
    declared; C++ kernels inside namespaces as "ns::name"."""
    text = clean(source)
    found = {}
    for d in definitions(text):
        if d.qualifier != "__global__":
            continue
        params = tuple(_param(p) for p in _split(text[d.params[0]:d.params[1]]))
        signature = KernelSignature(d.name, params, d.extern_c, d.template, d.scope, d.line)
        key = d.name if d.extern_c or not d.scope else f"{d.scope}::{d.name}"
        found[key] = replace(found[key], overloaded=True) if key in found else signature
    return found


def definitions(text):
    """Every `__global__` or `__device__` function definition in the cleaned `text`, in source order."""
    text = _DIRECTIVE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    pairs = _brace_pairs(text)
    blocks = [(m.end() - 1, pairs.get(m.end() - 1, len(text)), m.group(1), m.group(0).startswith("extern"))
              for m in _BLOCK.finditer(text)]
    found = []
    for m in _QUALIFIER.finditer(text):
        head = _head(text, m.end())
        body = head and _BODY.match(text, head[2] + 1)
        if not body:  # a variable, or a declaration without a body
            continue
        qualified, open_paren, close_paren = head
        brace = body.end() - 1
        outer = [b for b in blocks if b[0] < m.start() < b[1]]
        names = [" ".join(b[2].split()).replace(" ", "") for b in outer if not b[3] and b[2]]
        names += qualified.split("::")[:-1]
        prefix = text[max(text.rfind(c, 0, m.start()) for c in ";{}") + 1:m.start()]
        extern_c = any(b[3] for b in outer) or re.search(r'\bextern\s*"C"', prefix) is not None
        template = re.search(r"\btemplate\s*<", prefix) is not None
        found.append(Definition(m.group(1), qualified.split("::")[-1], "::".join(n for n in names if n),
                                text.count("\n", 0, m.start()) + 1, m.start(), (open_paren + 1, close_paren),
                                (brace, pairs.get(brace, len(text))), extern_c, template))
    return found


def _head(text, pos):
    """(qualified name, offset of "(", offset of ")") of the function declared from `pos`, skipping
    `__launch_bounds__(...)` and like attributes; None where a ";", "{" or "=" comes first (a variable)."""
    while True:
        stop = _STOP.search(text, pos)
        if stop is None or stop.group(0) != "(":
            return None
        callee = _CALLEE.search(text, pos, stop.start())
        close = _close(text, stop.start())
        if callee is None or close is None:
            return None
        name = re.sub(r"\s+", "", callee.group(2))
        if name not in _ATTRIBUTES:
            return name, stop.start(), close
        pos = close + 1


def _close(text, start):
    """The offset of the bracket closing the one at `start`, or None."""
    depth = 0
    for m in _BRACKET.finditer(text, start):
        depth += 1 if m.group(0) in "([{" else -1
        if depth == 0:
            return m.start()
    return None


def _brace_pairs(text):
    """{offset of "{": offset of its "}"}."""
    pairs, stack = {}, []
    for m in re.finditer(r"[{}]", text):
        if m.group(0) == "{":
            stack.append(m.start())
        elif stack:
            pairs[stack.pop()] = m.start()
    return pairs


def _split(params):
    """The parameter texts of a parameter list, split at commas outside brackets; `(void)` has none."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(params):
        if c in "([{<":
            depth += 1
        elif c in ")]}>":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(params[start:i])
            start = i + 1
    parts.append(params[start:])
    parts = [p.strip() for p in parts]
    return [] if parts in ([""], ["void"]) else parts


def _param(text):
    """The Param declared by one parameter's text."""
    text = text.split("=")[0].strip()
    if "(" in text:  # a function pointer: nothing Python could pass
        return Param("", " ".join(text.split()), None)
    tokens = _tokens(text)
    dims = []
    while tokens and tokens[-1].startswith("["):
        dims.insert(0, tokens.pop())
    name = ""
    last = tokens[-1] if tokens else ""
    if (re.fullmatch(r"[A-Za-z_]\w*", last) and last not in _TYPE_WORDS | _QUALIFIERS
            and any(t not in _QUALIFIERS | _ELABORATED for t in tokens[:-1])):
        name = tokens.pop()
    tokens = [t for t in tokens if t not in ("__restrict__", "__restrict", "restrict")]
    if dims:  # an array parameter is a pointer
        tokens += ["*"] + dims[1:]
    return Param(name, _spell(tokens), _kind(tokens))


def _tokens(text):
    """Words, `::`, `*`, `&`, `[...]` and whole `<...>` template arguments."""
    tokens, pos = [], 0
    while True:
        m = _TOKEN.search(text, pos)
        if m is None:
            return tokens
        if m.group(0) != "<":
            tokens.append(m.group(0))
            pos = m.end()
            continue
        depth, end = 0, m.start()
        for end in range(m.start(), len(text)):
            depth += {"<": 1, ">": -1}.get(text[end], 0)
            if depth == 0:
                break
        tokens.append(" ".join(text[m.start():end + 1].split()))
        pos = end + 1


def _spell(tokens):
    """Normalised type text: words spaced, `*` after a space, `**` together, `::` and `<...>` attached."""
    out = ""
    for t in tokens:
        if t == "*":
            out += "*" if out.endswith("*") else " *"
        elif t == "::" or out.endswith("::") or t.startswith("<"):
            out += t
        else:
            out += (" " if out else "") + t
    return out


def _kind(tokens):
    """The launch code of a parameter type, or None."""
    if "&" in tokens or "&&" in tokens:
        return None
    if "*" in tokens:
        return "p"
    words = [t for t in tokens if t not in _QUALIFIERS]
    if words and set(words) <= _BUILTIN:
        if "short" in words or "char" in words:
            return None
        wide = "long" in words  # long is 64 bits on LP64 (Linux), as long long is
        return ("q" if wide else "u") if "unsigned" in words else ("l" if wide else "i")
    named = "".join(words)
    named = named[2:] if named.startswith("::") else named
    return _NAMED.get(named[5:] if named.startswith("std::") else named)
