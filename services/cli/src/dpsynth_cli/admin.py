"""``dpsynth admin ...``: tenants and keys.

Tenants and policies need the platform admin key (the bootstrap admin tenant's); a tenant's
owner key manages its own tenant's keys (issue 14, item 6).
"""

from __future__ import annotations

from typing import Annotated

import typer

from dpsynth_cli.common import cli_errors, print_json, state_of

app = typer.Typer(help="Tenants (platform admin key) and API keys (platform admin, or a "
                  "tenant's owner key for its own tenant).", no_args_is_help=True)
tenant = typer.Typer(help="Tenants.", no_args_is_help=True)
key = typer.Typer(help="API keys.", no_args_is_help=True)
app.add_typer(tenant, name="tenant")
app.add_typer(key, name="key")


def parse_scopes(csv: str) -> list[str]:
    """``read,submit`` → ``["read", "submit"]`` (blank items dropped)."""
    return [s.strip() for s in csv.split(",") if s.strip()]


@tenant.command("create")
@cli_errors
def create_tenant(ctx: typer.Context, name: str) -> None:
    """Create tenant NAME and its first key (printed once: keep it; platform admin)."""
    print_json(state_of(ctx).client().create_tenant(name))


@key.command("create")
@cli_errors
def create_key(ctx: typer.Context, tenant: Annotated[str, typer.Option(help="tenant id")],
               scopes: Annotated[str, typer.Option(help="comma separated")] = "read,submit,owner"
               ) -> None:
    """Create a key for a tenant (printed once: keep it). An owner key creates keys for
    its own tenant only; the admin scope is granted only to the platform's admin tenant."""
    print_json(state_of(ctx).client().create_key(tenant, parse_scopes(scopes)))


@key.command("revoke")
@cli_errors
def revoke_key(ctx: typer.Context, key_id: str) -> None:
    """Revoke a key (an owner key: its own tenant's keys only)."""
    print_json(state_of(ctx).client().revoke_key(key_id))


@tenant.command("set-policy")
@cli_errors
def set_policy(ctx: typer.Context, tenant_id: str,
               max_dataset_epsilon_limit: Annotated[float | None, typer.Option(
                   help="cap on any single private dataset's epsilon limit")] = None,
               clear: Annotated[bool, typer.Option("--clear", help="remove the cap")] = False
               ) -> None:
    """Set a tenant's cap on dataset limits (uploads above it are refused); lists the
    tenant's existing datasets above the new cap."""
    if (max_dataset_epsilon_limit is None) != clear:
        raise typer.BadParameter("give --max-dataset-epsilon-limit or --clear")
    print_json(state_of(ctx).client().set_tenant_policy(
        tenant_id, max_dataset_epsilon_limit=max_dataset_epsilon_limit))
