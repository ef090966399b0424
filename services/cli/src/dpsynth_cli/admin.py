"""``dpsynth admin ...``: tenants and keys.

Tenants and policies need the platform admin key (the bootstrap admin tenant's); a tenant's
owner key manages its own tenant's keys (issue 14, item 6).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from dpsynth_cli.common import cli_errors, console, print_json, state_of
from dpsynth_cli.options import CliTyper, JsonFlag, YesFlag, confirm_irreversible

app = CliTyper(help="Tenants (platform admin key) and API keys (platform admin, or a "
               "tenant's owner key for its own tenant).")
tenant = CliTyper(help="Tenants.")
key = CliTyper(help="API keys.")
app.add_typer(tenant, name="tenant")
app.add_typer(key, name="key")


def parse_scopes(csv: str) -> list[str]:
    """``read,submit`` → ``["read", "submit"]`` (blank items dropped)."""
    return [s.strip() for s in csv.split(",") if s.strip()]


@tenant.command("create")
@cli_errors
def create_tenant(ctx: typer.Context,
                  name: Annotated[str, typer.Argument(help="the tenant's display name",
                                                      show_default=False)],
                  json_: JsonFlag = False) -> None:
    """Create tenant NAME and its first key (printed once: keep it; platform admin)."""
    body = state_of(ctx).client().create_tenant(name)
    if json_:
        print_json(body)
        return
    console.print(f"tenant {body.get('tenant_id')} \"{body.get('name')}\" created",
                  highlight=False)
    _print_key(body.get("key") or {})


def _print_key(created: dict[str, Any]) -> None:
    """A new key's id, tenant and scopes, then the secret, said to be shown only once."""
    console.print(f"key {created.get('key_id')} of tenant {created.get('tenant_id')}, scopes "
                  f"{', '.join(created.get('scopes') or [])}", highlight=False)
    console.print(f"api key (shown once, keep it): {created.get('api_key')}",
                  highlight=False, markup=False, soft_wrap=True)


@key.command("create")
@cli_errors
def create_key(ctx: typer.Context,
               tenant: Annotated[str, typer.Option(help="the tenant's id (ten_...)")],
               scopes: Annotated[str, typer.Option(
                   help="comma separated among read, submit, owner, admin")]
               = "read,submit,owner",
               json_: JsonFlag = False) -> None:
    """Create a key for a tenant (printed once: keep it). An owner key creates keys for
    its own tenant only; the admin scope is granted only to the platform's admin tenant."""
    body = state_of(ctx).client().create_key(tenant, parse_scopes(scopes))
    if json_:
        print_json(body)
        return
    _print_key(body)


@key.command("revoke")
@cli_errors
def revoke_key(ctx: typer.Context,
               key_id: Annotated[str, typer.Argument(help="the key's id (not the secret)",
                                                     show_default=False)],
               yes: YesFlag = False, json_: JsonFlag = False) -> None:
    """Revoke a key: it stops authenticating at once, for good (an owner key: its own
    tenant's keys only). Asks for confirmation; --yes skips it."""
    confirm_irreversible(f"revoke key {key_id}: every client using it stops working", yes=yes)
    body = state_of(ctx).client().revoke_key(key_id)
    if json_:
        print_json(body)
        return
    console.print(f"key {body.get('key_id', key_id)} revoked at {body.get('revoked_at')}",
                  highlight=False)


@tenant.command("set-policy")
@cli_errors
def set_policy(ctx: typer.Context,
               tenant_id: Annotated[str, typer.Argument(help="the tenant's id (ten_...)",
                                                        show_default=False)],
               max_dataset_epsilon_limit: Annotated[float | None, typer.Option(
                   help="cap on any single private dataset's epsilon limit")] = None,
               clear: Annotated[bool, typer.Option("--clear", help="remove the cap")] = False,
               json_: JsonFlag = False) -> None:
    """Set a tenant's cap on dataset limits (uploads above it are refused); lists the
    tenant's existing datasets above the new cap."""
    if (max_dataset_epsilon_limit is None) != clear:
        raise typer.BadParameter("give --max-dataset-epsilon-limit or --clear")
    body = state_of(ctx).client().set_tenant_policy(
        tenant_id, max_dataset_epsilon_limit=max_dataset_epsilon_limit)
    if json_:
        print_json(body)
        return
    cap = body.get("max_dataset_epsilon_limit")
    console.print(f"tenant {body.get('tenant_id', tenant_id)}: cap on a dataset's epsilon "
                  f"limit {'none' if cap is None else cap}", highlight=False)
    for above in body.get("datasets_above_cap") or []:
        text = (", ".join(f"{k} {v}" for k, v in above.items()) if isinstance(above, dict)
                else str(above))
        console.print(f"  above the cap (it binds new uploads only): {text}",
                      highlight=False, soft_wrap=True)
