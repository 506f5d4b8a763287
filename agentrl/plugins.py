"""The plugin manager: loads plugins from entry points and collects what they register.

Built-in and third-party plugins load the same way, through the ``agentrl`` entry-point group.
We walk the entry points ourselves: pluggy's own loader silently skips a second plugin whose
name is taken, and we want a failing or duplicate plugin named in the error.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import pluggy

from agentrl import hookspecs
from agentrl.errors import ConfigError, PluginError, unknown_name_message
from agentrl.faults import import_deadline, import_timeout_s, plugin_exit
from agentrl.imports import import_module_or_file

ENTRY_POINT_GROUP = "agentrl"
KINDS = ("env", "reward", "reward_scheme", "rollout", "algorithm", "engine", "tool_parser", "settings")
_REGISTRATION_HOOKS = {
    "env": "agentrl_register_envs",
    "reward": "agentrl_register_rewards",
    "reward_scheme": "agentrl_register_reward_schemes",
    "rollout": "agentrl_register_rollouts",
    "algorithm": "agentrl_register_algorithms",
    "engine": "agentrl_register_engines",
    "tool_parser": "agentrl_register_tool_parsers",
    "settings": "agentrl_register_settings",
}
_MISSING_BUILTINS = "agentrl's built-in plugins were not found: is agentrl installed (`pip install -e .`)?"


@dataclass(frozen=True)
class Component:
    """One registered component: its name, the factory and the plugin that owns it."""

    kind: str
    name: str
    factory: Any
    plugin: str
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class PluginInfo:
    """One loaded plugin: entry-point name, distribution and version, and what it registered."""

    name: str
    module: str
    distribution: str | None
    version: str | None
    registered: dict[str, list[str]] = field(default_factory=dict)


class Registry:
    """All components by kind and name; refuses a name registered twice, naming both owners."""

    def __init__(self) -> None:
        self._components: dict[str, dict[str, Component]] = {kind: {} for kind in KINDS}

    def add(self, kind: str, name: str, factory: Any, plugin: str, **meta: Any) -> None:
        """Record ``name`` of ``kind``; raise PluginError if another plugin already owns it."""
        if not isinstance(name, str) or not name:
            raise PluginError(f"plugin {plugin!r} registered a {kind} with an invalid name {name!r}")
        taken = self._components[kind].get(name)
        if taken is not None:
            raise PluginError(
                f"{kind} {name!r} is registered by two plugins: {taken.plugin!r} and {plugin!r}. "
                f"Uninstall or disable one of them (--disable-plugin NAME)."
            )
        self._components[kind][name] = Component(kind, name, factory, plugin, meta)

    def get(self, kind: str, name: str) -> Component:
        """The component ``name`` of ``kind``, or a PluginError suggesting the closest name."""
        try:
            return self._components[kind][name]
        except KeyError:
            raise PluginError(unknown_name_message(kind, name, self._components[kind])) from None

    def names(self, kind: str) -> list[str]:
        """Sorted names registered for ``kind``."""
        return sorted(self._components[kind])

    def components(self) -> Iterable[Component]:
        """Every component of every kind."""
        for by_name in self._components.values():
            yield from by_name.values()


class PluginManager:
    """A pluggy manager plus the registry its registration hooks filled.

    Create one per run (tests create one per test); nothing is global.
    """

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.registry = Registry()
        self.plugins: dict[str, PluginInfo] = {}

    @property
    def hook(self) -> Any:
        """The hook relay: ``manager.hook.agentrl_on_step_end(step=..., metrics=...)``; a hook
        implementation that raises SystemExit or KeyboardInterrupt (not a real Ctrl-C) stops the
        run with a PluginError naming its plugin and the hook (:mod:`agentrl.faults`)."""
        return _HookRelay(self.pm)

    def register_plugin(
        self, plugin: ModuleType | object, name: str, distribution: str | None = None, version: str | None = None
    ) -> None:
        """Register one plugin object/module under ``name`` and collect its registrations."""
        if name in self.plugins:
            raise PluginError(
                f"two plugins are named {name!r}: {self.plugins[name].module!r} and "
                f"{getattr(plugin, '__name__', type(plugin).__name__)!r}"
            )
        self._check_hookimpls(plugin, name)
        try:
            self.pm.register(plugin, name=name)
        except Exception as exc:  # pluggy validates hookimpl signatures here
            raise PluginError(
                f"plugin {name!r} has an invalid hook implementation: {exc}. The hook reference "
                "(docs/hooks.md) lists each hook's arguments."
            ) from exc
        module = getattr(plugin, "__name__", type(plugin).__name__)
        info = PluginInfo(name=name, module=module, distribution=distribution, version=version)
        self.plugins[name] = info
        for kind, hook_name in _REGISTRATION_HOOKS.items():
            impls = [i for i in getattr(self.pm.hook, hook_name).get_hookimpls() if i.plugin is plugin]
            for impl in impls:
                try:
                    impl.function(register=self._register_callback(kind, name, info))
                except PluginError:
                    raise
                except (Exception, SystemExit, KeyboardInterrupt) as exc:
                    failure = exc if isinstance(exc, Exception) else plugin_exit(exc)
                    if failure is None:  # a real Ctrl-C
                        raise
                    raise PluginError(f"plugin {name!r} raised in {hook_name}: {failure!r}") from exc

    def _check_hookimpls(self, plugin: object, name: str) -> None:
        """Refuse what pluggy would accept silently: a misspelt hook name (never called) and a
        parameter with a default value (never passed)."""
        specs = [n for n in dir(hookspecs) if n.startswith("agentrl_")]
        for attr in dir(plugin):
            function = getattr(plugin, attr, None)
            if self.pm.parse_hookimpl_opts(plugin, attr) is None or not callable(function):
                continue
            if attr not in specs:
                close = difflib.get_close_matches(attr, specs, n=1)
                fix = f"rename it to {close[0]!r}" if close else "docs/hooks.md lists the hooks"
                raise PluginError(f"plugin {name!r} implements {attr!r}, which is not an agentrl hook; {fix}")
            defaulted = [p.name for p in inspect.signature(function).parameters.values() if p.default is not p.empty]
            if defaulted:
                raise PluginError(
                    f"plugin {name!r}: hook {attr} gives parameter(s) {', '.join(defaulted)} a default "
                    "value, so pluggy would never pass them; remove the default(s)"
                )

    def _register_callback(self, kind: str, plugin_name: str, info: PluginInfo) -> Callable[..., None]:
        def register(name: str, factory: Any, **meta: Any) -> None:
            self.registry.add(kind, name, factory, plugin_name, **meta)
            info.registered.setdefault(kind, []).append(name)

        return register

    def load_entry_points(self, disabled: Iterable[str] = (), require_builtins: bool = True) -> None:
        """Import and register every ``agentrl`` entry point except the ``disabled`` names."""
        disabled = set(disabled)
        entry_points = list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))
        if require_builtins and not any(_distribution_name(ep) == "agentrl" for ep in entry_points):
            raise PluginError(_MISSING_BUILTINS)
        names = {ep.name for ep in entry_points}
        unknown = sorted(disabled - names)
        if unknown:  # a typo would otherwise leave the plugin loaded without a word
            raise PluginError(
                unknown_name_message(
                    "plugin", unknown[0], names, "--disable-plugin takes a name that `agentrl plugins` lists."
                )
            )
        seconds = import_timeout_s()
        for ep in sorted(entry_points, key=lambda e: (_distribution_name(e) != "agentrl", e.name)):
            if ep.name in disabled:
                continue
            dist = _distribution_name(ep)
            what = f"plugin {ep.name!r} (entry point {ep.value!r} of {dist or 'unknown package'})"
            fix = f"Fix or uninstall it, or disable it with --disable-plugin {ep.name}."
            try:
                with import_deadline(what, seconds, hint=f"{fix} "):
                    plugin = ep.load()
            except PluginError:
                raise
            except (Exception, SystemExit, KeyboardInterrupt) as exc:
                failure = exc if isinstance(exc, Exception) else plugin_exit(exc)
                if failure is None:  # a real Ctrl-C
                    raise
                raise PluginError(f"{what} failed to import: {failure!r}. {fix}") from exc
            version = ep.dist.version if ep.dist is not None else None
            self.register_plugin(plugin, name=ep.name, distribution=dist, version=version)

    def load_module(self, import_path: str) -> None:
        """Register a plugin given by import path or file (``--plugin my_pkg.plugin`` or
        ``--plugin path/to/plugin.py``); the current directory is importable."""
        try:
            with import_deadline(f"plugin {import_path!r}", import_timeout_s()):
                module = import_module_or_file(import_path, f"plugin {import_path!r}")
        except ConfigError as exc:
            raise PluginError(str(exc)) from exc.__cause__
        self.register_plugin(module, name=import_path)


class _HookRelay:
    """pluggy's hook relay, each hook caller wrapped in a :class:`_GuardedHook`."""

    def __init__(self, pm: pluggy.PluginManager) -> None:
        self._pm = pm

    def __getattr__(self, name: str) -> _GuardedHook:
        return _GuardedHook(getattr(self._pm.hook, name))


class _GuardedHook:
    """A pluggy hook caller whose implementations may not end the process (see ``PluginManager.hook``)."""

    def __init__(self, caller: Any) -> None:
        self._caller = caller

    def __getattr__(self, name: str) -> Any:
        return getattr(self._caller, name)

    def __call__(self, **kwargs: Any) -> Any:
        try:
            return self._caller(**kwargs)
        except (SystemExit, KeyboardInterrupt) as exc:
            failure = plugin_exit(exc)
            if failure is None:  # a real Ctrl-C
                raise
            raise PluginError(
                f"plugin {self._owner(exc)!r} raised in hook {self._caller.name}: {failure} "
                "(a hook cannot be skipped: the run stops)"
            ) from exc

    def _owner(self, exc: BaseException) -> str:
        """The plugin whose hook implementation raised ``exc`` (the innermost one in its traceback)."""
        owners = {
            impl.function.__code__: impl.plugin_name
            for impl in self._caller.get_hookimpls()
            if hasattr(impl.function, "__code__")
        }
        tb, found = exc.__traceback__, "unknown"
        while tb is not None:
            found = owners.get(tb.tb_frame.f_code, found)
            tb = tb.tb_next
        return found


def _distribution_name(ep: importlib.metadata.EntryPoint) -> str | None:
    return ep.dist.name if ep.dist is not None else None


def load_plugins(disabled: Iterable[str] = (), modules: Iterable[str] = ()) -> PluginManager:
    """A fresh PluginManager with the core defaults, every installed plugin and ``modules``."""
    from agentrl import defaults

    manager = PluginManager()
    manager.register_plugin(defaults, name="agentrl.defaults", distribution="agentrl")
    manager.load_entry_points(disabled=disabled)
    for module in modules:
        manager.load_module(module)
    return manager
