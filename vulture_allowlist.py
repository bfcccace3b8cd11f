# Names vulture reports as unused that are used, by a framework or by name:
# `make lint` runs `vulture` ([tool.vulture] in pyproject.toml), which reads
# this file as code that uses them. Format: `vulture --make-whitelist`.
# Add a name only when it is truly used (say by what); delete dead code instead.
# (Decorated routes, click commands, Celery tasks and SQLAlchemy listeners are
# not listed: [tool.vulture]'s ignore_decorators covers them.)
# ruff: noqa
# mypy: ignore-errors

# pydantic: the class-level configuration every model reads.
model_config  # unused variable (the models in metering/api, bench)
# pydantic fields: validated in request bodies, or serialised in responses.
next_attempt_at  # unused variable (metering/api/webhooks.py: DeliveryOut)
attempt_log  # unused variable (metering/api/webhooks.py: DeliveryOut)
per_unit_micro_minor  # unused variable (metering/api/prices.py: PriceOut)
specversion  # unused variable (metering/api/models.py: CloudEvent)
datacontenttype  # unused variable (metering/api/models.py: CloudEvent)
quarantined_at  # unused variable (metering/api/quarantine.py: QuarantineOut)

# click: ClickException.exit_code, read by click when it exits.
exit_code  # unused variable (metering/cli/context.py: CliError)
# click: a group's command lookup, called by click when it parses and lists commands.
_.list_commands  # unused method (metering/cli/__init__.py: CommandsOnDemand)
_.get_command  # unused method (metering/cli/__init__.py: CommandsOnDemand)
_.resolve_command  # unused method (metering/cli/__init__.py: CommandsOnDemand)
# click: a group's help lists its commands through it.
_.format_commands  # unused method (metering/cli/context.py: SentenceGroup, metering/cli/__init__.py)
# rich: attributes of a Table, read when it is printed.
_.show_edge  # unused attribute (metering/cli/tables.py)
_.pad_edge  # unused attribute (metering/cli/tables.py)
# rich: a ProgressColumn's render, called by the Progress it is in.
_.render  # unused method (metering/cli/imports.py: _Rate)
_.padding  # unused attribute (metering/cli/tables.py)

# http.server: the handler's POST method and its log hook, and the server's option.
_.do_POST  # unused method (metering/demo.py, bench/bench_webhooks.py)
_.log_message  # unused method (metering/demo.py, bench/bench_webhooks.py)
_.daemon_threads  # unused attribute (metering/demo.py, bench/bench_webhooks.py)
# logging: a LogRecord's message, rewritten by a filter.
_.msg  # unused attribute (metering/telemetry/logs.py: RedactSecrets)
# logging: a LogRecord's field, written for the formatter (task_name in JSON lines).
_.task_name  # unused attribute (workers/observability.py)
# sqlite3: the DB-API connection's attribute (None: SQLAlchemy issues BEGIN).
_.isolation_level  # unused attribute (metering/storage/connections.py)
# httpcore: a NetworkBackend's method, called by httpcore for a Unix socket.
_.connect_unix_socket  # unused method (metering/webhooks/destinations.py)

# PEP 562: the module's __getattr__, called by Python for a missing name.
__getattr__  # unused function (metering/__init__.py)

# Public API: FrozenClock.advance, for users' tests (docs/api.md, docs/allowances.md).
_.advance  # unused method (metering/clock.py)

# Alembic: every migration's revision chain and downgrade step, read by Alembic.
down_revision  # unused variable (metering/storage/migrations/versions/*.py)
branch_labels  # unused variable (metering/storage/migrations/versions/*.py)
depends_on  # unused variable (metering/storage/migrations/versions/*.py)
downgrade  # unused function (metering/storage/migrations/versions/*.py)

# Celery and kombu: classes named in configuration as "module:Class".
EmbeddedTransport  # unused class (metering/storage/broker.py; metering.pipeline.transport.EMBEDDED_TRANSPORT)
HeartbeatScheduler  # unused class (workers/beat.py; beat_scheduler in workers/app.py)
GuardedConsumer  # unused class (workers/guard.py; worker_consumer in workers/app.py)
# Celery and kombu: settings, read by Celery and kombu.
_.polling_interval  # unused attribute (workers/app.py: kombu's SQLAlchemy transport)
_.broker_transport  # unused attribute (workers/app.py: app.conf)
# Celery: beat's scheduler sends each due task through it (celery.beat.Scheduler.tick).
_.apply_entry  # unused method (workers/beat.py: HeartbeatScheduler)
# kombu: the Redis channel's poll methods and state, called and read by kombu's poller.
_._brpop_start  # unused method (workers/guard.py)
_._brpop_read  # unused method (workers/guard.py)
_._in_poll  # unused attribute (workers/guard.py)
_._brpop_sent_at  # unused attribute (workers/guard.py)
# Celery bootsteps: the ordering and the switch of a worker step, read by Celery.
requires  # unused variable (workers/heartbeat.py, workers/observability.py, workers/webhooks.py)
_.include_if  # unused method (workers/observability.py, workers/webhooks.py)
# Celery signals: the receiver's signature (signals are sent with sender=).
sender  # unused variable (workers/observability.py)

# pytest: the hook by which Sybil collects the code blocks of README.md and docs/.
pytest_collect_file  # unused variable (conftest.py)
pytest_collection_modifyitems  # unused function (conftest.py: marks documents that start servers)

# Introspection the tests are about: how many hot-path connections a pool holds.
_.open_connections  # unused property (metering/storage/hot/direct_postgres.py)

# In flux: speed round. Dead, in files other helpers are changing now: to
# remove once those land (listed in the report of issue 21 point 6).
BUSY  # unused variable (metering/leases.py)
_.held_units  # unused method (metering/leases.py; only tests/integration/lease_hammer.py)
_.matches  # unused method (metering/middleware/routes.py; only tests)
_.count_by_state  # unused method (metering/storage/reservations.py)
_.from_  # the history model's "from" (metering/api/history.py; read by the OpenAPI document)
_.warnings  # the added endpoint's warnings (metering/api/webhooks.py; read by the OpenAPI document)

# `metering.domain.jsonable.fields_dict` reads a record's attributes by the names of its keys.
_.would_deny  # unused property (metering/domain/decisions.py: Decision, in DECISION_KEYS)
# A function's qualified name and signature, read by repr, help() and inspect.
_.__qualname__  # unused attribute (metering/reports/overage.py: listed)
_.__signature__  # unused attribute (metering/reports/overage.py: listed)
