"""Decorators turning plain functions into :class:`~agentbolt.litagent.LitAgent` instances.

The decorated function receives the task as its first argument; the other arguments are injected by parameter
name, each resolved from the rollout's resources by type:

* ``llm``: the first :class:`~agentbolt.types.LLM` resource (a :class:`~agentbolt.types.ProxyLLM` counts, and is
  bound to the rollout's attempt unless ``strip_proxy=False``);
* ``prompt_template``: the first :class:`~agentbolt.types.PromptTemplate` resource;
* ``rollout``: the :class:`~agentbolt.types.Rollout` being executed.
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
from collections.abc import Mapping
from typing import Any, Callable, Dict, List, Optional, Tuple, Type, TypeVar, Union, overload

from agentbolt.types import LLM, NamedResources, PromptTemplate, ProxyLLM, Rollout, RolloutRawResult
from agentbolt.utils.checks import check_bool

from .litagent import LitAgent

__all__ = ["FunctionalLitAgent", "llm_rollout", "prompt_rollout", "rollout"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
RolloutFunc = Callable[..., Any]


def _parameter_names(func: Callable[..., Any]) -> List[str]:
    return list(inspect.signature(func).parameters)


def _callable_name(func: Callable[..., Any]) -> str:
    """A name for error messages; partials and callable objects have no ``__name__``."""
    return getattr(func, "__name__", None) or repr(func)


def _is_coroutine_callable(func: Callable[..., Any]) -> bool:
    """Whether calling ``func`` returns a coroutine: a coroutine function, or an object whose ``__call__`` is one."""
    if inspect.iscoroutinefunction(func):
        return True
    return callable(func) and not inspect.isroutine(func) and inspect.iscoroutinefunction(type(func).__call__)


def _module_attribute(module_name: Optional[str], qualname: Optional[str]) -> Any:
    """The object ``qualname`` (dotted for nested names) names in the imported module ``module_name``, or None."""
    obj: Any = sys.modules.get(module_name) if module_name else None
    for part in (qualname or "").split("."):
        if obj is None or not part:
            return None
        obj = getattr(obj, part, None)
    return obj


class FunctionalLitAgent(LitAgent[T]):
    """A :class:`LitAgent` backed by a rollout function (sync or async).

    Args:
        rollout_func: The function; its first parameter receives the task, the parameters named ``llm``,
            ``prompt_template`` and ``rollout`` receive the matching resources / the rollout.
        strip_proxy: Convert a :class:`~agentbolt.types.ProxyLLM` into a plain LLM bound to the current attempt.

    Raises:
        TypeError: ``strip_proxy`` is not a bool.
    """

    def __init__(self, rollout_func: RolloutFunc, *, strip_proxy: bool = True) -> None:
        super().__init__()
        self._rollout_func = rollout_func
        self._strip_proxy = check_bool(strip_proxy, "strip_proxy")
        self._is_async = _is_coroutine_callable(rollout_func)
        self._parameters = set(_parameter_names(rollout_func))
        functools.update_wrapper(self, rollout_func)  # type: ignore[arg-type]

    def __reduce__(self) -> Union[str, Tuple[Any, ...]]:
        """Pickle the agent by name when the attribute of its module with that name is the agent itself.

        The agent takes its function's ``__module__`` and ``__qualname__``, so decorating a module-level function
        makes that name refer to the agent: pickle refuses the function itself (the name no longer refers to it),
        but can pickle the agent by name, as it pickles functions and classes. Such an agent is then re-created by
        importing its module, which is how the ``spawn`` and ``forkserver`` start methods of
        :mod:`multiprocessing` ship it to a child process. Any other agent (one made by calling a decorator, say)
        pickles its function and settings.
        """
        qualname = getattr(self, "__qualname__", None)
        if qualname and _module_attribute(getattr(self, "__module__", None), qualname) is self:
            return qualname
        return _new_agent, (type(self),), self.__getstate__()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the wrapped function directly."""
        return self._rollout_func(*args, **kwargs)

    def is_async(self) -> bool:
        """Whether the wrapped function is a coroutine function."""
        return self._is_async

    def _accepts_rollout(self) -> bool:
        return "rollout" in self._parameters

    def _accepts_llm(self) -> bool:
        return "llm" in self._parameters

    def _accepts_prompt_template(self) -> bool:
        return "prompt_template" in self._parameters

    def _get_llm(self, resources: NamedResources, rollout: Rollout) -> LLM:
        llms = [(name, res) for name, res in resources.items() if isinstance(res, LLM)]
        if not llms:
            raise ValueError("No LLM resource found in the provided resources.")
        if len(llms) > 1:
            logger.warning(
                "Multiple LLM resources found (%s); using the first one, %r.", [name for name, _ in llms], llms[0][0]
            )
        llm = llms[0][1]
        if self._strip_proxy and isinstance(llm, ProxyLLM):
            llm = llm.with_attempted_rollout(rollout)  # type: ignore[arg-type]  # it checks the type
        return llm

    @staticmethod
    def _get_prompt_template(resources: NamedResources) -> PromptTemplate:
        templates = [res for res in resources.values() if isinstance(res, PromptTemplate)]
        if not templates:
            raise ValueError("No prompt template resource found in the provided resources.")
        if len(templates) > 1:
            logger.warning("Multiple prompt template resources found; using the first one.")
        return templates[0]

    def _build_kwargs(self, resources: NamedResources, rollout: Rollout) -> Dict[str, Any]:
        """The keyword arguments for the wrapped function; every rollout entry point passes its resources here.

        Raises:
            TypeError: ``resources`` is not a mapping.
        """
        if not isinstance(resources, Mapping):
            raise TypeError(
                f"resources must be NamedResources (a mapping of names to resources, such as "
                f"{{'main_llm': LLM(...)}}), got {type(resources).__name__}"
            )
        kwargs: Dict[str, Any] = {}
        if self._accepts_rollout():
            kwargs["rollout"] = rollout
        if self._accepts_llm():
            kwargs["llm"] = self._get_llm(resources, rollout)
        if self._accepts_prompt_template():
            kwargs["prompt_template"] = self._get_prompt_template(resources)
        return kwargs

    def rollout(self, task: T, resources: NamedResources, rollout: Rollout) -> RolloutRawResult:
        """Call the (synchronous) wrapped function with the injected arguments.

        Raises:
            RuntimeError: If the wrapped function is a coroutine function.
            TypeError: If ``resources`` is not a mapping of names to resources.
        """
        if self._is_async:
            raise RuntimeError(f"{_callable_name(self._rollout_func)} is async; call rollout_async() instead.")
        return self._rollout_func(task, **self._build_kwargs(resources, rollout))

    async def rollout_async(self, task: T, resources: NamedResources, rollout: Rollout) -> RolloutRawResult:
        """Await the (coroutine) wrapped function with the injected arguments.

        Raises:
            RuntimeError: If the wrapped function is synchronous.
            TypeError: If ``resources`` is not a mapping of names to resources.
        """
        if not self._is_async:
            raise RuntimeError(f"{_callable_name(self._rollout_func)} is synchronous; call rollout() instead.")
        return await self._rollout_func(task, **self._build_kwargs(resources, rollout))


def _new_agent(cls: Type[FunctionalLitAgent[Any]]) -> FunctionalLitAgent[Any]:
    """An empty agent of class ``cls``, which unpickling fills in with the pickled agent's state."""
    return cls.__new__(cls)


def _validate_rollout_func(func: RolloutFunc, resource_param: str) -> None:
    names = _parameter_names(func)
    name = _callable_name(func)
    if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
        raise TypeError(
            f"{name} is a generator function: a rollout function returns its result (or None), it does not yield"
        )
    if len(names) < 2:
        raise ValueError(f"{name} must take at least two parameters, `task` and `{resource_param}`; got {names}.")
    if names[0] != "task":
        hint = (
            "; for a method, decorate the bound method instead (`llm_rollout(obj.method)`)"
            if names[0] == "self"
            else ""
        )
        raise ValueError(f"The first parameter of {name} must be named `task`, got `{names[0]}`{hint}.")
    if resource_param not in names:
        raise ValueError(f"{name} must have a parameter named `{resource_param}`; got {names}.")
    _check_callable_as_rollout(func, name)


_INJECTED_PARAMS = ("llm", "prompt_template", "rollout")


def _check_callable_as_rollout(func: RolloutFunc, name: str) -> None:
    """Raise ``TypeError`` unless ``func(task, llm=..., prompt_template=..., rollout=...)`` can bind its parameters.

    The runner passes the task positionally and the injected values by keyword; every other parameter needs a
    default, or the call would fail on every rollout instead of here.
    """
    params = list(inspect.signature(func).parameters.values())
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if params[0].kind not in positional:
        raise TypeError(f"`task` of {name} must be positional (the task is passed positionally); it is keyword-only.")
    for param in params[1:]:
        if param.name in _INJECTED_PARAMS:
            if param.kind is inspect.Parameter.POSITIONAL_ONLY:
                raise TypeError(
                    f"`{param.name}` of {name} is positional-only, but it is passed by keyword; remove the `/`."
                )
        elif param.default is inspect.Parameter.empty and param.kind in (
            *positional,
            inspect.Parameter.KEYWORD_ONLY,
        ):
            raise TypeError(
                f"{name} has a required parameter `{param.name}` that the runner cannot fill: give it a default, "
                f"or accept only `task` plus any of {list(_INJECTED_PARAMS)}."
            )


def _validate_llm_rollout_func(func: RolloutFunc) -> None:
    _validate_rollout_func(func, "llm")


def _validate_prompt_rollout_func(func: RolloutFunc) -> None:
    _validate_rollout_func(func, "prompt_template")


def _agent_or_decorator(
    func: Optional[RolloutFunc], validate: Callable[[RolloutFunc], None], strip_proxy: bool
) -> Union[FunctionalLitAgent[Any], Callable[[RolloutFunc], FunctionalLitAgent[Any]]]:
    """The agent made from ``func`` after ``validate`` accepts it; a decorator doing that when ``func`` is None."""
    check_bool(strip_proxy, "strip_proxy")

    def decorator(f: RolloutFunc) -> FunctionalLitAgent[Any]:
        validate(f)
        return FunctionalLitAgent(f, strip_proxy=strip_proxy)

    return decorator if func is None else decorator(func)


@overload
def llm_rollout(func: RolloutFunc, *, strip_proxy: bool = True) -> FunctionalLitAgent[Any]: ...


@overload
def llm_rollout(func: None = None, *, strip_proxy: bool = True) -> Callable[[RolloutFunc], FunctionalLitAgent[Any]]: ...


def llm_rollout(
    func: Optional[RolloutFunc] = None, *, strip_proxy: bool = True
) -> Union[FunctionalLitAgent[Any], Callable[[RolloutFunc], FunctionalLitAgent[Any]]]:
    """Make an agent from ``def f(task, llm[, rollout])`` (sync or async); usable bare or with arguments.

    Args:
        func: The rollout function (when used as a bare decorator).
        strip_proxy: Bind a :class:`~agentbolt.types.ProxyLLM` to the current attempt before injecting it.

    Returns:
        The agent, or a decorator producing it.

    Raises:
        ValueError: If the function does not take ``task`` first and an ``llm`` parameter.
        TypeError: If it is a generator function, or has parameters a rollout call cannot fill (another
            parameter without a default, a positional-only ``llm``/``rollout``, a keyword-only ``task``); or if
            ``strip_proxy`` is not a bool.
    """
    return _agent_or_decorator(func, _validate_llm_rollout_func, strip_proxy)


@overload
def prompt_rollout(func: RolloutFunc) -> FunctionalLitAgent[Any]: ...


@overload
def prompt_rollout(func: None = None) -> Callable[[RolloutFunc], FunctionalLitAgent[Any]]: ...


def prompt_rollout(
    func: Optional[RolloutFunc] = None,
) -> Union[FunctionalLitAgent[Any], Callable[[RolloutFunc], FunctionalLitAgent[Any]]]:
    """Make an agent from ``def f(task, prompt_template[, rollout])`` (sync or async); usable bare or called.

    Args:
        func: The rollout function (when used as a bare decorator).

    Returns:
        The agent, or a decorator producing it.

    Raises:
        ValueError: If the function does not take ``task`` first and a ``prompt_template`` parameter.
        TypeError: As for :func:`llm_rollout`.
    """
    return _agent_or_decorator(func, _validate_prompt_rollout_func, strip_proxy=False)


def rollout(func: RolloutFunc) -> FunctionalLitAgent[Any]:
    """Make an agent from a function taking ``task`` plus ``llm`` and/or ``prompt_template``.

    Args:
        func: The rollout function, sync or async.

    Returns:
        The agent.

    Raises:
        NotImplementedError: If the signature matches neither supported pattern.
        TypeError: As for :func:`llm_rollout`.
    """
    try:
        return llm_rollout(func)
    except ValueError:
        pass
    try:
        return prompt_rollout(func)
    except ValueError:
        pass
    raise NotImplementedError(
        f"Cannot make an agent from {_callable_name(func)!r}: expected a signature like "
        "`def agent(task, llm, [rollout])` or `def agent(task, prompt_template, [rollout])` (sync or async)."
    )
