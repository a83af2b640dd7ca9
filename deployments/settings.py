"""Router settings applied to a running application through its ``user_config``: no redeploy, no restart.

    python -m deployments.settings apply tuned_settings.yaml [--app raysearch]
    python -m deployments.settings show [--app raysearch]

Serve updates a deployment's ``user_config`` in place (each router replica's ``reconfigure`` runs) when
the application is deployed from a config, as ``serve run serve_config.yaml``, ``serve deploy`` and
``python -m deployments`` all do. ``apply`` reads the deployed config back, puts the merged settings
in a per-deployment override (the ``deployments:`` list of a Serve config), and deploys that config
again. The application's ``args`` are left as they were, so Serve sees the same code version and
restarts nothing. The same YAML can be pasted under ``deployments: - name: router, user_config:`` of
a Serve config file for ``serve deploy``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from deployments.config import BUILDER, RouterSettings

ROUTER = "router"  # the router deployment's name (app.build_app)


def _client(address: str | None = None):
    """Serve's controller client. ``address``: the Ray cluster (default RAY_ADDRESS, else the newest cluster
    started on this machine)."""
    import os

    import ray
    from ray.serve.context import _connect

    if not ray.is_initialized():
        ray.init(address=address or os.environ.get("RAY_ADDRESS") or "auto", namespace="serve", log_to_driver=False)
    return _connect()


def deploy_app(args: dict[str, Any], name: str = "raysearch", route_prefix: str = "/",
               env_vars: dict[str, str] | None = None, timeout_s: float = 900,
               autoscaling_policy: dict[str, Any] | None = None) -> None:
    """Deploy ``deployments.serve.app:build_app`` with ``args`` from a config (as ``serve run CONFIG`` does), so
    that its settings can later be changed in place; waits until the application runs. ``autoscaling_policy``: the
    application-level policy, as a Serve config names it (``deployments.serve.autoscale``)."""
    from ray import serve
    from ray.serve.schema import ServeDeploySchema

    client = _client()
    apps = declared_apps(client)
    apps[name] = {"name": name, "route_prefix": route_prefix, "import_path": BUILDER,
                  "args": args, **({"runtime_env": {"env_vars": env_vars}} if env_vars else {}),
                  **({"autoscaling_policy": autoscaling_policy} if autoscaling_policy else {})}
    client.deploy_apps(ServeDeploySchema(applications=list(apps.values())))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = serve.status().applications.get(name)
        if status is not None and status.status == "RUNNING":
            return
        if status is not None and status.status == "DEPLOY_FAILED":
            raise RuntimeError(f"application {name!r} failed to deploy: {status.message}")
        time.sleep(0.5)
    raise RuntimeError(f"application {name!r} was not running after {timeout_s:.0f} s")


def declared_apps(client) -> dict[str, dict]:
    """The applications deployed from a config, as config dicts (imperative ones have none)."""
    details = client.get_serve_details()
    out = {}
    for name, app in (details.get("applications") or {}).items():
        config = app.get("deployed_app_config")
        if config is not None:
            out[name] = config
    return out


def current_router_settings(app: str = "raysearch", address: str | None = None) -> dict[str, Any]:
    details = _client(address).get_serve_details()
    try:
        deployment = details["applications"][app]["deployments"][ROUTER]
    except KeyError:
        raise ValueError(f"no application {app!r} with a {ROUTER!r} deployment is running") from None
    return dict(deployment["deployment_config"].get("user_config") or {})


def apply_router_settings(settings: dict[str, Any], app: str = "raysearch", address: str | None = None) -> RouterSettings:
    """Merge ``settings`` into the running router's user_config and deploy it in place. Raises ValueError
    for settings RouterSettings refuses (nothing is applied) and RuntimeError for an application that
    was not deployed from a config."""
    client = _client(address)
    apps = declared_apps(client)
    if app not in apps:
        raise RuntimeError(
            f"application {app!r} is not running from a config (serve run CONFIG, serve deploy or python -m "
            "deployments), so its settings cannot be changed in place; redeploy it with the settings instead")
    merged = RouterSettings(**(current_router_settings(app, address) | settings))  # validates before anything changes
    config = apps[app]
    overrides = [d for d in config.get("deployments") or [] if d.get("name") != ROUTER]
    router = next((d for d in config.get("deployments") or [] if d.get("name") == ROUTER), {"name": ROUTER})
    config["deployments"] = overrides + [router | {"user_config": merged.model_dump(mode="json")}]
    from ray.serve.schema import ServeDeploySchema

    client.deploy_apps(ServeDeploySchema(applications=list(apps.values())))
    return merged


def read_settings(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of router settings")
    RouterSettings(**data)  # every name and value checked before it reaches the service
    return data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m deployments.settings", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("apply", help="merge a settings file into the running router's user_config")
    p.add_argument("file", type=Path, help="YAML mapping of router settings (python -m relevance.tune writes one)")
    p = sub.add_parser("show", help="print the running router's settings")
    for p in sub.choices.values():
        p.add_argument("--app", default="raysearch", help="the Serve application's name")
        p.add_argument("--address", help="the Ray cluster (default: RAY_ADDRESS, else the newest one on this machine)")
    args = ap.parse_args(argv)
    try:
        if args.command == "show":
            print(yaml.safe_dump(current_router_settings(args.app, args.address), sort_keys=True), end="")
            return 0
        changed = read_settings(args.file)
        merged = apply_router_settings(changed, args.app, args.address)
    except (OSError, ValueError, RuntimeError, ConnectionError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"applied to {args.app!r} (router replicas reconfigure in place): "
          + ", ".join(f"{k}={getattr(merged, k)}" for k in changed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
