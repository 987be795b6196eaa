"""The channel between the candidate's process and the tests' process, and both of its ends.

Not imported by the harness: `suites.sandbox` passes this file's source to each sandboxed
interpreter, which loads it as a module before it confines itself (standard library only).

The candidate's code and the tests never share an interpreter. The candidate process executes
the code, then answers requests: look a name up, call, get or set an attribute, len, iterate,
index, bool, str. In the tests process each name the tests take from the candidate is a proxy
(`Remote`) whose every use is one such request. Only plain data crosses, as JSON: None, bool,
int, float, complex, str, bytes, and lists, tuples, dicts, sets and frozensets of them, each of
exactly that type; anything else stays in the candidate process and crosses as a handle. So the
tests compare values that their own interpreter built: an object "equal to everything" arrives
as a handle, and a handle equals only itself; a patched builtin, a replaced `exec`, a patched
preamble on the candidate's side change what the candidate answers, never how it is judged.

Arguments pass by value: a test that checks how the candidate mutated a list it was given sees
its own, unchanged list. A function or other object of the tests cannot be passed to the
candidate (TypeError).
"""

import builtins
import json
import os

MAX_DEPTH = 100                 # nesting of one value
MAX_MESSAGE = 16 << 20          # bytes in one message
MESSAGE_CHARS = 200             # of an exception's line in a verdict (before where it was raised)
_SCALARS = (type(None), bool, int, float, str)
_CONTAINERS = {list: "l", tuple: "t", set: "s", frozenset: "f"}
_BUILD = {"l": list, "t": tuple, "s": set, "f": frozenset}


class ProtocolError(BaseException):
    """The candidate's side sent something that is not an answer (never caught by tests)."""


class CandidateGone(BaseException):
    """The candidate's process ended (or closed the channel) before answering."""


class CandidateForbidden(BaseException):
    """The candidate attempted an operation the sandbox refused (reported by its audit hook)."""


class CandidateError(Exception):
    """An exception of the candidate's whose type has no builtin counterpart here."""


# --- values ----------------------------------------------------------------------------------

def encode(value, handle, depth=0):
    """`value` as JSON-able data; `handle(obj)` stands for anything that is not plain data."""
    kind = type(value)
    if kind is int and not -(1 << 63) <= value < 1 << 63:
        return {"i": format(value, "x")}  # hex has no digit limit, unlike decimal str()
    if kind in _SCALARS:
        return value
    if depth >= MAX_DEPTH:
        raise ValueError(f"a value nested deeper than {MAX_DEPTH} cannot cross the sandbox")
    if kind in _CONTAINERS:
        return {_CONTAINERS[kind]: [encode(v, handle, depth + 1) for v in value]}
    if kind is dict:
        return {"d": [[encode(k, handle, depth + 1), encode(v, handle, depth + 1)]
                      for k, v in value.items()]}
    if kind is bytes:
        return {"b": value.hex()}
    if kind is complex:
        return {"c": [value.real, value.imag]}
    return handle(value)


def decode(data, resolve, depth=0):
    """The value `encode` described; `resolve([id, type])` gives the object behind a handle."""
    if type(data) in _SCALARS:
        return data
    if depth >= MAX_DEPTH or type(data) is not dict or len(data) != 1:
        raise ProtocolError(f"not a value: {str(data)[:100]}")
    (tag, payload), = data.items()
    try:
        if tag in _BUILD and type(payload) is list:
            return _BUILD[tag](decode(v, resolve, depth + 1) for v in payload)
        if tag == "d" and type(payload) is list:
            return {decode(k, resolve, depth + 1): decode(v, resolve, depth + 1) for k, v in payload}
        if tag == "i" and type(payload) is str:
            return int(payload, 16)
        if tag == "b" and type(payload) is str:
            return bytes.fromhex(payload)
        if tag == "c" and type(payload) is list:
            return complex(*(float(x) for x in payload))
        if tag == "h" and type(payload) is list and len(payload) == 2 and type(payload[0]) is int:
            return resolve(payload)
    except (TypeError, ValueError) as exc:  # an unhashable key, a malformed number
        raise ProtocolError(f"not a value: {exc}") from None
    raise ProtocolError(f"not a value: {str(data)[:100]}")


# --- errors ----------------------------------------------------------------------------------

_SOURCES = {}  # filename -> source, for tracebacks of code that has no file


def register_source(filename, source):
    _SOURCES[filename] = source


def format_error(exc, limit=2000):
    """(one line saying what and where, the last frames of the traceback)."""
    try:
        import linecache  # only when something failed: these imports cost ~10 ms
        import traceback
        for filename, source in _SOURCES.items():
            linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        # The exception's line, cut: a grade needs the type and the start of the message, and
        # the rest would only carry what the code read (the host's facts) out in Grade.detail.
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()[:MESSAGE_CHARS]
        frames = traceback.extract_tb(exc.__traceback__)
        if frames and frames[-1].filename in ("<solution>", "<tests>", "<prefix>"):
            last = frames[-1]  # a bare "AssertionError" does not say which test failed
            text += f" ({last.filename} line {last.lineno}: {(last.line or '').strip()[:200]})"
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-4))
    except BaseException:  # an exception whose __str__ raises
        text, tb = type(exc).__name__, ""
    return text[:limit], tb[-4 * limit:]


def describe(exc):
    """An exception of the candidate's as data: its nearest builtin type, errno, message."""
    try:
        base = next(c.__name__ for c in type(exc).__mro__ if getattr(builtins, c.__name__, None) is c)
        errno = exc.errno if isinstance(exc, OSError) and type(exc.errno) is int else None
        message = str(exc.strerror if errno is not None else exc)[:2000]
        text, tb = format_error(exc)
        return {"base": base, "errno": errno, "message": message, "text": text, "traceback": tb}
    except BaseException:
        return {"base": "Exception", "errno": None, "message": "", "text": "unprintable error",
                "traceback": ""}


def rebuild(err):
    """A local exception standing for the candidate's (builtin type, so `except` works)."""
    if type(err) is not dict:
        raise ProtocolError("not an error description")
    cls = getattr(builtins, str(err.get("base")), None)
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        cls = CandidateError  # SystemExit and the like: not something a test may catch
    message, errno = str(err.get("message", ""))[:2000], err.get("errno")
    try:
        exc = cls(errno, message) if issubclass(cls, OSError) and type(errno) is int else cls(message)
    except Exception:  # a builtin with a richer constructor (UnicodeDecodeError)
        exc = CandidateError(message)
    exc.candidate_text = str(err.get("text", ""))[:2000] or f"{cls.__name__}: {message}"
    exc.candidate_traceback = str(err.get("traceback", ""))[:8000]
    return exc


def classify(exc):
    """(outcome, detail) of a tests run that ended with `exc` (None: every test passed)."""
    if exc is None:
        return "ok", ""
    if isinstance(exc, CandidateForbidden):
        return "forbidden", str(exc)
    if isinstance(exc, CandidateGone):
        return "gone", "the candidate's process ended before the tests finished"
    if isinstance(exc, ProtocolError):
        return "error", f"the candidate broke the protocol: {exc}"
    text = getattr(exc, "candidate_text", None) or format_error(exc)[0]
    if isinstance(exc, MemoryError):
        return "memory", text
    if isinstance(exc, OSError) and exc.errno == 27:  # EFBIG: RLIMIT_FSIZE (SIGXFSZ is ignored)
        return "file_size", text
    if isinstance(exc, OSError) and exc.errno in (1, 13, 30):  # EPERM, EACCES, EROFS
        return "forbidden", text  # stopped by a kernel layer rather than by the audit hook
    if isinstance(exc, AssertionError):
        return "failed", text
    return "error", text


# --- the channel -----------------------------------------------------------------------------

class Channel:
    """One JSON message per line, each way."""

    def __init__(self, read_fd, write_fd):
        self._in = os.fdopen(read_fd, "rb")
        self._out = os.fdopen(write_fd, "wb")

    def send(self, message):
        try:
            self._out.write(json.dumps(message).encode() + b"\n")
            self._out.flush()
        except (BrokenPipeError, ValueError):  # ValueError: flushing a closed file
            raise CandidateGone() from None

    def receive(self):
        line = self._in.readline(MAX_MESSAGE + 1)
        if not line:
            raise CandidateGone()
        if len(line) > MAX_MESSAGE:
            raise ProtocolError(f"a message longer than {MAX_MESSAGE >> 20} MiB")
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            raise ProtocolError(f"not JSON: {line[:100]!r}") from None
        if type(message) is not dict:
            raise ProtocolError(f"not a message: {line[:100]!r}")
        return message


# --- the candidate's end ---------------------------------------------------------------------

class Server:
    """Answers the tests' requests about the objects in `namespace`."""

    def __init__(self, namespace, channel, violations):
        self.namespace, self.channel, self.violations = namespace, channel, violations
        self.objects, self.ids = [], {}

    def handle(self, obj):
        key = id(obj)
        if key not in self.ids:
            self.ids[key] = len(self.objects)
            self.objects.append(obj)  # kept alive, so an id is never reused
        return {"h": [self.ids[key], type(obj).__name__[:100]]}

    def resolve(self, ref):
        if not 0 <= ref[0] < len(self.objects):
            raise ProtocolError("unknown handle")
        return self.objects[ref[0]]

    def reply(self, message):
        if self.violations:
            message["forbidden"] = self.violations[0]
        self.channel.send(message)

    def answer(self, request):
        op = request.get("op")
        args = [decode(a, self.resolve) for a in request.get("args", [])]
        if op == "get":
            if args[0] not in self.namespace:
                raise NameError(f"name {args[0]!r} is not defined")
            return self.namespace[args[0]]
        target = args[0]
        if op == "call":
            return target(*args[1], **args[2])
        simple = {"getattr": getattr, "setattr": setattr, "delattr": delattr, "len": len,
                  "iter": iter, "next": next, "bool": bool, "str": str,
                  "getitem": lambda o, k: o[k], "contains": lambda o, x: x in o,
                  "setitem": lambda o, k, v: o.__setitem__(k, v),
                  "delitem": lambda o, k: o.__delitem__(k)}
        if op not in simple:
            raise ProtocolError(f"unknown operation {op!r}")
        return simple[op](*args)

    def serve(self):
        while True:
            try:
                request = self.channel.receive()
            except (CandidateGone, ProtocolError):
                return  # the tests are done with us
            try:
                self.reply({"value": encode(self.answer(request), self.handle)})
            except CandidateGone:
                return
            except BaseException as exc:  # StopIteration and SystemExit answer too
                try:
                    self.reply({"raise": describe(exc)})
                except CandidateGone:
                    return


def run_candidate(code, channel, violations):
    """Execute the candidate's code, say how that went, then answer requests until EOF."""
    namespace = {"__name__": "__sandbox__", "__builtins__": builtins}
    register_source("<solution>", code)
    error = None
    try:
        exec(compile(code, "<solution>", "exec"), namespace)
    except BaseException as exc:
        error = exc
    server = Server(namespace, channel, violations)
    try:
        server.reply({"loaded": None if error is None else describe(error)})
    except CandidateGone:
        return
    if error is None:
        server.serve()


# --- the tests' end --------------------------------------------------------------------------

class Remote:
    """An object that lives in the candidate's process. It equals only itself."""

    __slots__ = ("_channel", "_ref")

    def __init__(self, channel, ref):
        object.__setattr__(self, "_channel", channel)
        object.__setattr__(self, "_ref", tuple(ref))

    def _ask(self, op, *args):
        return self._channel.request(op, self, *args)

    def __repr__(self):
        return f"<candidate's {self._ref[1]} object>"

    def __eq__(self, other):
        return type(other) is Remote and other._ref[0] == self._ref[0]

    def __ne__(self, other):
        return not self == other

    def __hash__(self):
        return hash(("remote", self._ref[0]))

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)  # protocols are looked up on the type, as for any object
        return self._ask("getattr", name)

    def __setattr__(self, name, value):
        self._ask("setattr", name, value)

    def __delattr__(self, name):
        self._ask("delattr", name)

    def __call__(self, *args, **kwargs):
        return self._ask("call", list(args), kwargs)

    def __len__(self):
        return _checked(self._ask("len"), int, "len()")

    def __bool__(self):
        return _checked(self._ask("bool"), bool, "bool()")

    def __str__(self):
        return _checked(self._ask("str"), str, "str()")

    def __iter__(self):
        it = self._ask("iter")
        return it if type(it) is Remote else iter(it)

    def __next__(self):
        return self._ask("next")

    def __getitem__(self, key):
        return self._ask("getitem", key)

    def __setitem__(self, key, value):
        self._ask("setitem", key, value)

    def __delitem__(self, key):
        self._ask("delitem", key)

    def __contains__(self, item):
        return _checked(self._ask("contains", item), bool, "in")


def _checked(value, kind, what):
    if type(value) is not kind:
        raise TypeError(f"{what} of a candidate's object returned {type(value).__name__}")
    return value


class Client(Channel):
    """The tests' end: requests to the candidate, answers decoded into local values."""

    def receive(self):
        message = super().receive()
        if message.get("forbidden"):
            raise CandidateForbidden(str(message["forbidden"])[:500])
        return message

    def request(self, op, *args):
        self.send({"op": op, "args": [encode(a, _remote_ref) for a in args]})
        answer = self.receive()
        if "raise" in answer:
            raise rebuild(answer["raise"])
        if "value" not in answer:
            raise ProtocolError("an answer without a value")
        return decode(answer["value"], lambda ref: Remote(self, ref))


def _remote_ref(obj):
    if type(obj) is Remote:
        return {"h": list(obj._ref)}
    raise TypeError(f"only plain data can be passed to the candidate, not {type(obj).__name__}")


def run_tests(prefix, tests, names, client):
    """Execute `prefix`, bind `names` to the candidate's objects, execute `tests`.
    Returns (outcome, detail, traceback) as `classify` names them."""
    namespace = {"__name__": "__sandbox__", "__builtins__": builtins}
    error = None
    try:
        for filename, source in (("<prefix>", prefix), ("<tests>", tests)):
            register_source(filename, source)
        exec(compile(prefix, "<prefix>", "exec"), namespace)
        loaded = client.receive().get("loaded", "missing")
        if loaded is not None:
            raise rebuild(loaded)
        for name in names:
            try:
                namespace[name] = client.request("get", name)
            except NameError:
                namespace.pop(name, None)  # the candidate lacks it: a NameError where used
        exec(compile(tests, "<tests>", "exec"), namespace)
    except BaseException as exc:
        error = exc
    outcome, detail = classify(error)
    trace = ""
    if error is not None:
        trace = getattr(error, "candidate_traceback", "") or format_error(error)[1]
    return outcome, detail, trace
