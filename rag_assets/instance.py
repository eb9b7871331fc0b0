"""Start check of the Dagster instance: ``python -m rag_assets.instance check``.

Reads ``$DAGSTER_HOME/dagster.yaml`` (or ``--config``). For PostgreSQL storage
(``storage.postgres``, dagster.production.yaml) it resolves the settings from the environment,
checks the driver scheme, connects with a short timeout and opens the instance (which creates or
migrates Dagster's tables). Any problem is ONE line on stderr naming the setting (the
environment variable when the value comes from one), with the password redacted; exit status 1.
Success prints one line naming the storage and exits 0. SQLite storage is checked by opening it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import yaml

from rag_core.secrets import scrub_secrets
from rag_core.settings import redact_dsn

CONNECT_TIMEOUT_S = 5
#: SQLAlchemy maps a bare ``postgresql://`` to psycopg 3 when it is installed (it is, for the
#: sidecar), and dagster-postgres' ``NOTIFY run_events, $1`` fails on it.
REQUIRED_SCHEME = "postgresql+psycopg2"
DB_FIELDS = ("username", "password", "hostname", "db_name", "port")


class InstanceConfigError(RuntimeError):
    """The instance configuration is unusable; the message is one line, secrets redacted."""


@dataclass(frozen=True)
class PgStorage:
    """The resolved ``storage.postgres`` settings: ``url`` (with password), ``where`` (the
    setting names, e.g. ``storage.postgres.postgres_db (DAGSTER_PG_HOST, ...)``), ``password``."""

    url: str
    where: str
    password: str

    @property
    def safe_url(self) -> str:
        """The URL with the password replaced by ``***``."""
        return redact_dsn(self.url)


def _resolve(value: Any, setting: str, names: dict[str, str]) -> str:
    """A config value, ``{env: VAR}`` read from the environment; records the variable name."""
    if isinstance(value, Mapping) and "env" in value:
        var = str(value["env"])
        names[setting] = var
        if var not in os.environ:
            raise InstanceConfigError(f"{setting}: environment variable {var} is not set")
        return os.environ[var]
    names[setting] = setting
    return "" if value is None else str(value)


def pg_storage(config: Mapping[str, Any], config_path: Path) -> PgStorage | None:
    """The PostgreSQL storage of an instance config, or None when it uses another storage.

    Raises InstanceConfigError (one line) for a missing variable or a scheme other than
    ``postgresql+psycopg2``.
    """
    from dagster_postgres.utils import get_conn_string

    storage = (config.get("storage") or {}).get("postgres")
    if storage is None:
        return None
    base = f"{config_path}: storage.postgres"
    names: dict[str, str] = {}
    if "postgres_url" in storage:
        url = _resolve(storage["postgres_url"], f"{base}.postgres_url", names)
        where = names[f"{base}.postgres_url"]
        password = unquote(urlsplit(url).password or "")
        scheme = url.split("://", 1)[0]
        scheme_setting = where
    else:
        db = storage.get("postgres_db") or {}
        values = {f: _resolve(db.get(f), f, names) for f in DB_FIELDS if f in db}
        scheme = str(db.get("scheme") or "postgresql")
        url = get_conn_string(**values, params=db.get("params"), scheme=scheme)
        where = f"{base}.postgres_db ({', '.join(names[f] for f in DB_FIELDS if f in names)})"
        password = values.get("password", "")
        scheme_setting = f"{base}.postgres_db.scheme"
    if scheme != REQUIRED_SCHEME:
        raise InstanceConfigError(
            f"{scheme_setting}: scheme is {scheme!r}: use {REQUIRED_SCHEME!r} (a bare postgresql:// "
            "selects psycopg 3, on which dagster-postgres fails at the first write)"
        )
    return PgStorage(url=url, where=where, password=password)


def _one_line(exc: BaseException, storage: PgStorage) -> str:
    text = " ".join(str(getattr(exc, "orig", None) or exc).split())
    if storage.password:
        text = text.replace(storage.password, "***")
    return scrub_secrets(text)[:300]


def check_pg(storage: PgStorage) -> None:
    """Connect and run ``SELECT 1``; InstanceConfigError naming the settings when that fails."""
    import sqlalchemy as sa

    engine = sa.create_engine(
        storage.url, connect_args={"connect_timeout": CONNECT_TIMEOUT_S}, poolclass=sa.pool.NullPool
    )
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except sa.exc.SQLAlchemyError as exc:
        raise InstanceConfigError(
            f"{storage.where}: cannot connect to {storage.safe_url}: {_one_line(exc, storage)}"
        ) from None
    finally:
        engine.dispose()


def load_config(config_path: Path) -> dict[str, Any]:
    """The instance YAML as a dict (InstanceConfigError when missing or not a mapping)."""
    try:
        config = yaml.safe_load(config_path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise InstanceConfigError(
            f"{config_path}: cannot read the instance config: {' '.join(str(exc).split())}"
        ) from None
    if not isinstance(config, dict):
        raise InstanceConfigError(f"{config_path}: the instance config is not a mapping")
    return config


def check_instance(home: Path, config_path: Path | None = None) -> str:
    """Check the instance of ``home`` (DAGSTER_HOME); returns a one-line summary.

    Raises InstanceConfigError (one line, password redacted) when it is unusable.
    """
    config_path = config_path or home / "dagster.yaml"
    config = load_config(config_path)
    storage = pg_storage(config, config_path)
    if storage is not None:
        check_pg(storage)
    import dagster as dg

    try:
        with dg.DagsterInstance.from_config(str(home), config_filename=config_path.name) as instance:
            instance.get_runs(limit=1)
    except Exception as exc:  # noqa: BLE001 - any failure to open the instance is the finding
        where = storage.where if storage else f"{config_path}: storage"
        message = _one_line(exc, storage) if storage else " ".join(str(exc).split())[:300]
        raise InstanceConfigError(f"{where}: cannot open the Dagster instance: {message}") from None
    target = storage.safe_url if storage else "sqlite under " + str(home)
    return f"Dagster instance in {home} is usable (storage: {target})"


def main(argv: list[str] | None = None) -> int:
    """``check``: exit 0 and one line when usable, 1 and one line on stderr otherwise."""
    parser = argparse.ArgumentParser(prog="python -m rag_assets.instance", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["check"])
    parser.add_argument("--config", type=Path, default=None, help="instance YAML (default: $DAGSTER_HOME/dagster.yaml)")
    args = parser.parse_args(argv)
    home_env = os.environ.get("DAGSTER_HOME", "").strip()
    if not home_env and args.config is None:
        print("DAGSTER_HOME is not set: set it to the directory holding dagster.yaml", file=sys.stderr)
        return 1
    home = Path(home_env or args.config.parent).expanduser().resolve()
    try:
        print(check_instance(home, args.config))
    except InstanceConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
