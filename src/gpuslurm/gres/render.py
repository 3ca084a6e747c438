"""Render gres.conf and the slurm.conf NodeName= line through the jinja2 templates."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2

from gpuslurm import __version__
from gpuslurm.errors import InputError, one_line
from gpuslurm.gres.features import FEATURE_RE, hardware_features, merge_features
from gpuslurm.gres.records import GresOptions, GresPlan, plan_gres
from gpuslurm.hw.model.node import Node
from gpuslurm.names import check_node_name

GRES_TEMPLATE = "gres.conf.j2"
NODE_TEMPLATE = "node.conf.j2"


def template_dir() -> Path:
    """Installed wheels carry the templates inside the package; a source checkout at its top."""
    here = Path(__file__).resolve()
    for candidate in (here.parents[1] / "gres-templates", here.parents[3] / "gres-templates"):
        if candidate.is_dir():
            return candidate
    raise InputError("gres-templates directory not found (broken installation?)")


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    """jinja2's per-user template cache, which saves compiling the template on every run.

    jinja2 keeps it in ``$TMPDIR/_jinja2-cache-<uid>``, creates it mode 0700 and refuses it
    (RuntimeError) unless it is a real directory owned by us, so root never follows a path
    another user planted. Any problem means no cache, never a failure.
    """
    if os.environ.get("GPUSLURM_NO_TEMPLATE_CACHE"):
        return None
    try:
        return jinja2.FileSystemBytecodeCache()
    except (OSError, RuntimeError):
        return None


def _render(name: str, template_file: Path | None, context: dict[str, Any]) -> str:
    if template_file is not None:
        from gpuslurm.safedir import read_regular_text

        try:
            text = read_regular_text(str(template_file), 1 << 20)
        except FileNotFoundError:
            raise InputError("template file not found", template_file) from None
        except OSError as exc:
            raise InputError(f"cannot read: {exc.strerror}", template_file) from None
        except UnicodeDecodeError as exc:
            raise InputError(f"not UTF-8 text (byte {exc.start})", template_file) from None
        loader: jinja2.BaseLoader = jinja2.DictLoader({template_file.name: text})
        name = template_file.name
    else:
        loader = jinja2.FileSystemLoader(str(template_dir()))
    env = jinja2.Environment(  # noqa: S701 - config files, not HTML
        loader=loader, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined, bytecode_cache=_bytecode_cache(),
    )
    try:
        return env.get_template(name).render(**context)
    except jinja2.TemplateSyntaxError as exc:
        raise InputError(f"template syntax error at line {exc.lineno}: {exc.message}",
                         template_file or name) from None
    except jinja2.UndefinedError as exc:
        raise InputError(f"template uses an unknown variable: {exc.message}", template_file or name) from None


def _base_context(node: Node) -> dict[str, Any]:
    # captured strings go into comment lines: a line break (U+2028 too) in one must never start a
    # line of its own in the generated file
    return {
        "version": __version__,
        "source": one_line(node.source or "unknown"),
        "hostname": one_line(node.hostname),
        "driver_version": node.driver_version and one_line(node.driver_version),
        "cuda_version": node.cuda_version and one_line(node.cuda_version),
    }


def render_gres_conf(node: Node, opts: GresOptions, template_file: Path | None = None) -> str:
    plan = plan_gres(node, opts)
    return render_plan(node, plan, opts, template_file)


def render_plan(node: Node, plan: GresPlan, opts: GresOptions, template_file: Path | None = None) -> str:
    if opts.node_name:
        check_node_name(opts.node_name, source="--node-name", hostlist=True)
    context = _base_context(node) | {
        "node_name": opts.node_name,
        "prefix": f"NodeName={opts.node_name} " if opts.node_name else "",
        "records": plan.records,
        "notes": list(node.warnings) + list(plan.notes),
    }
    return _render(GRES_TEMPLATE, template_file, context)


def gres_summary(plan: GresPlan) -> str:
    """The slurm.conf ``Gres=`` value: ``gpu:<type>:<n>`` per type, then mps and shard totals."""
    types = Counter(r.type for r in plan.records if r.name == "gpu")
    parts = [f"gpu:{t}:{n}" for t, n in types.items()]
    for name in ("mps", "shard"):
        total = sum(r.count or 0 for r in plan.records if r.name == name)
        if total:
            parts.append(f"{name}:{total}")
    return ",".join(parts)


def render_node_conf(node: Node, node_name: str | None = None, opts: GresOptions | None = None,
                     template_file: Path | None = None, features: Sequence[str] = (),
                     cc: Mapping[str, tuple[int, int]] | None = None) -> str:
    """The slurm.conf NodeName= line; ``Features=`` is ``features`` (the admin's, kept first and
    as given) merged with the hardware's (:mod:`gpuslurm.gres.features`, ``cc`` from NVML)."""
    opts = opts or GresOptions()
    for f in features:
        if not FEATURE_RE.match(f):
            raise InputError(f"not a Slurm feature name: {f!r} (letters, digits, _ . -)",
                             "--feature")
    plan = plan_gres(node, opts)
    cmap = plan.core_map
    notes = list(node.warnings)
    if node.memory_mib is None:
        notes.append("RealMemory left out: the capture has no meminfo")
    name = node_name or opts.node_name or node.hostname
    check_node_name(name, source="--node-name" if node_name or opts.node_name else "captured hostname",
                    hostlist=True)
    context = _base_context(node) | {
        "node_name": name,
        "cpus": len(node.cpus),
        "sockets": cmap.sockets,
        "cores_per_socket": cmap.cores_per_socket,
        "threads_per_core": cmap.threads_per_core,
        "real_memory": node.memory_mib,
        "gres": gres_summary(plan),
        "features": ",".join(merge_features(features, hardware_features(node, cc))),
        "notes": notes,
    }
    return _render(NODE_TEMPLATE, template_file, context)
