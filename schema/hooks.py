"""Strawberry's extension hooks, found once per extension class.

For every operation, Strawberry looks each extension's hooks up again: for
each extension and each phase (operation, parsing, validation, execution) it
inspects the method and wraps it in a new context-manager function, about
fifty times a request with our extensions, and again for every event a
subscription delivers. What hooks a class has does not
change, so the wrapping is done once per class and phase here, and which of
an operation's extensions have each hook once per list of their classes;
each operation binds the hooks to its own extension instances, and they run
as Strawberry runs them.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import AsyncIterator, Callable, Iterator
from types import TracebackType
from typing import Any

from strawberry.extensions import SchemaExtension
from strawberry.types import StreamExecutionResult

from schema.strawberry_internals import (
    ExecutingContextManager,
    ExtensionContextManagerBase,
    OperationContextManager,
    ParsingContextManager,
    SchemaExtensionsRunner,
    StreamResultContextManager,
    ValidationContextManager,
    WrappedHook,
)

# (class, hook name) -> (a function making the hook's context manager from an
# instance, whether it is async), or None where the class has no such hook.
_Made = tuple[Callable[[SchemaExtension], Any], bool] | None
_MADE: dict[tuple[type, str], _Made] = {}


def _make(cls: type, name: str) -> _Made:
    hook: Any = getattr(cls, name)
    if hook is getattr(SchemaExtension, name):
        return None
    if inspect.isgeneratorfunction(hook):
        return contextlib.contextmanager(hook), False
    if inspect.isasyncgenfunction(hook):
        return contextlib.asynccontextmanager(hook), True
    if not callable(hook):
        raise ValueError(f"Hook {name} on {cls} must be callable, received {hook!r}")
    # A plain function is run on entering; a stream's result hook is given
    # the result too (`*result`), as Strawberry gives it.
    if inspect.iscoroutinefunction(hook):

        @contextlib.asynccontextmanager
        async def awaited(extension: SchemaExtension, *result: Any) -> AsyncIterator[None]:
            await hook(extension, *result)
            yield

        return awaited, True

    @contextlib.contextmanager
    def called(extension: SchemaExtension, *result: Any) -> Iterator[None]:
        hook(extension, *result)
        yield

    return called, False


# (hook name, the operation's extension classes in order) -> for each
# extension that has the hook: its place, its hook's maker, whether async.
_Plan = tuple[tuple[int, Callable[[SchemaExtension], Any], bool], ...]
_PLANS: dict[tuple[str, tuple[type, ...]], _Plan] = {}


def _plan(name: str, classes: tuple[type, ...]) -> _Plan:
    planned = []
    for place, cls in enumerate(classes):
        key = (cls, name)
        if key not in _MADE:
            _MADE[key] = _make(cls, name)
        made = _MADE[key]
        if made is not None:
            planned.append((place, *made))
    return tuple(planned)


class _FoundOnce(ExtensionContextManagerBase):
    def __init__(self, extensions: list[SchemaExtension]) -> None:
        self.default_hook = getattr(SchemaExtension, self.HOOK_NAME)
        key = (self.HOOK_NAME, tuple(type(extension) for extension in extensions))
        plan = _PLANS.get(key)
        if plan is None:
            plan = _PLANS[key] = _plan(*key)
        self.hooks = [
            WrappedHook(
                extension=extensions[place],
                hook=functools.partial(make, extensions[place]),
                is_async=is_async,
            )
            for place, make, is_async in plan
        ]
        self._sync = not any(hook.is_async for hook in self.hooks)

    # A phase whose hooks are all sync runs them in Strawberry's own sync
    # stack: the same order and exits, without a coroutine per exit.
    async def __aenter__(self) -> None:
        if self._sync:
            self.__enter__()
        else:
            await super().__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        if self._sync:
            self.__exit__(exc_type, exc_val, exc_tb)
        else:
            await super().__aexit__(exc_type, exc_val, exc_tb)


class _Operation(_FoundOnce, OperationContextManager):
    pass


class _Parsing(_FoundOnce, ParsingContextManager):
    pass


class _Validation(_FoundOnce, ValidationContextManager):
    pass


class _Executing(_FoundOnce, ExecutingContextManager):
    pass


class _StreamResult(_FoundOnce, StreamResultContextManager):
    # Every event of every subscription passes here: a thousand subscribers
    # of one event looked every extension's hook up a thousand times.
    def __init__(self, extensions: list[SchemaExtension], result: StreamExecutionResult) -> None:
        self.result = result
        _FoundOnce.__init__(self, extensions)


class HooksFoundOnce(SchemaExtensionsRunner):
    """Strawberry's runner, with each phase's hooks found once per class."""

    def on_stream_result(self, result: StreamExecutionResult) -> StreamResultContextManager:
        return _StreamResult(self.extensions, result)

    def operation(self) -> OperationContextManager:
        return _Operation(self.extensions)

    def validation(self) -> ValidationContextManager:
        return _Validation(self.extensions)

    def parsing(self) -> ParsingContextManager:
        return _Parsing(self.extensions)

    def executing(self) -> ExecutingContextManager:
        return _Executing(self.extensions)
