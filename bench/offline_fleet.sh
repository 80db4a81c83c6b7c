#!/bin/bash
# bench/fleet.py on a host that reaches no package registry and runs no PostgreSQL (a lent 16-core
# machine, issue 26): corral's runtime dependencies and PostgreSQL's binaries travel as wheels in
# .whl/ (git-ignored), are installed with `pip --target`, and PostgreSQL runs as an unprivileged
# user on this host. Make .whl/ where pip works, for the host's Python (3.12 here):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl pgserver==0.1.4 click starlette uvicorn httptools uvloop pydantic pydantic_core \
#     pydantic-settings python-dotenv typing-inspection annotated-types orjson psycopg psycopg-binary \
#     anyio h11 idna jinja2 markupsafe psutil typing_extensions prometheus-client
# (the versions of .venv: `.venv/bin/python -m pip list`). Then, on the host, from the checkout:
#   SIZES=2000,5000 REPLICAS=3 WINDOW=10 bash bench/offline_fleet.sh
#   SIZES=10000 REPLICAS=3 WINDOW=15 LOADS=4 FLEET_TIMEOUT=580 bash bench/offline_fleet.sh
# Settings: PY (python3), SITE (/tmp/site), PGPORT (5432: bench/fleet.py counts the backends of this
# port), OUT (where fleet.log and fleet.jsonl go), SIZES, REPLICAS, WINDOW, FLEET_TIMEOUT (480 s),
# LOADS (processes simulating the hosts, --load-processes: unset, fleet.py's default, a quarter of the
# cores: 4 on 16; 1: one process for every host, as before), EXTRA (more flags for bench/fleet.py,
# e.g. "--timeline"), TAG (a suffix for the log's name).
set -u
PY=${PY:-python3}
SITE=${SITE:-/tmp/site}
PORT=${PGPORT:-5432}
OUTDIR=${OUT:-/tmp/out}
mkdir -p "$OUTDIR"
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl || exit 3
export PYTHONPATH="$SITE:$PWD/src:$PWD/bench" PYTHONUNBUFFERED=1
PGBIN="$SITE/pgserver/pginstall/bin"
id pgrun >/dev/null 2>&1 || useradd -M -s /bin/sh pgrun || exit 4
chmod -R a+rX "$SITE/pgserver"
DATA=/tmp/pgdata-$PORT
rm -rf "$DATA"; mkdir -p "$DATA"; chown pgrun "$DATA"
su pgrun -c "$PGBIN/initdb -D $DATA -U postgres --auth=trust -E UTF8 --locale=C" > "$OUTDIR/initdb.log" 2>&1 || { tail "$OUTDIR/initdb.log"; exit 5; }
su pgrun -c "$PGBIN/pg_ctl -D $DATA -l $DATA/server.log -w -o '-p $PORT -k /tmp -c listen_addresses=127.0.0.1 -c max_connections=400 -c shared_buffers=2GB' start" || { tail "$DATA/server.log"; exit 6; }
trap 'su pgrun -c "$PGBIN/pg_ctl -D $DATA -m fast stop" >/dev/null 2>&1' EXIT
"$PGBIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres -c 'create database test' postgres || exit 7
echo "open files: $(ulimit -n) (hard $(ulimit -Hn)); $(nproc) cores"
timeout "${FLEET_TIMEOUT:-480}" $PY bench/fleet.py --db postgres --pg-url "postgresql://postgres@127.0.0.1:$PORT/test" \
  --replicas "${REPLICAS:-3}" --workers "${SIZES:-10000}" --batched --jobs-per-worker 8 --window-s "${WINDOW:-15}" \
  --settle-s 5 --timeout "${FLEET_TIMEOUT:-480}" --json "$OUTDIR/fleet.jsonl" ${LOADS:+--load-processes "$LOADS"} ${EXTRA:-} 2>&1 | tee "$OUTDIR/fleet${TAG:-}.log"
exit "${PIPESTATUS[0]}"
