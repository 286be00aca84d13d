#!/usr/bin/env bash
# A PostgreSQL server of the test's own, for the MLflow server tier (tests/mlflow_server):
#   postgres.sh up <dir> [port]   initdb into <dir>/data (once), start it on 127.0.0.1:<port> with its unix
#                                 socket in <dir>, create a role with a password and a database it owns, check
#                                 a password login over TCP, and print the SQLAlchemy URI as the last line
#   postgres.sh down <dir>        stop it (fast shutdown, then immediate, then SIGKILL: each wait bounded)
# Port: the argument, else $SPECSWEEP_PG_PORT, else 55432. Role, database and password: $SPECSWEEP_PG_USER
# (specsweep), $SPECSWEEP_PG_DB (mlflow), $SPECSWEEP_PG_PASSWORD (else a random one, kept in <dir>/password).
# Needs Debian's postgresql package (apt-get install -y postgresql: its binaries are found under
# /usr/lib/postgresql/<version>/bin, no cluster of the package's is used). initdb refuses root: as root the
# server runs as the `postgres` OS user (created by that package), else as a system user created here.
# Test settings only: fsync off (a crash loses the database; nothing in it outlives the test).
set -euo pipefail
usage="usage: postgres.sh up <dir> [port] | postgres.sh down <dir>"
action=${1:?$usage}
dir=$(realpath -m "${2:?$usage}")
data=$dir/data
log=$dir/postgres.log
export PGCONNECT_TIMEOUT=10

die() {  # message, exit code
  echo "postgres.sh: $1" >&2
  exit "${2:-1}"
}

bindir() {  # where pg_ctl, initdb and psql are: on PATH, else the newest Debian package's folder
  local found
  if found=$(command -v pg_ctl 2>/dev/null) && [[ -x $(dirname "$(realpath "$found")")/initdb ]]; then
    dirname "$(realpath "$found")"
    return
  fi
  found=$(find /usr/lib/postgresql -mindepth 3 -maxdepth 3 -path '*/bin/pg_ctl' 2>/dev/null | sort -V | tail -1)
  [[ -n $found ]] && dirname "$found"
}

# The OS user the server runs as: this one, or (as root) `postgres`, else a system user of our own.
pg_user=""
if [[ $(id -u) == 0 ]]; then
  if id postgres >/dev/null 2>&1; then
    pg_user=postgres
  else
    pg_user=specsweep-pg
    id "$pg_user" >/dev/null 2>&1 \
      || useradd --system --no-create-home --shell /usr/sbin/nologin "$pg_user" \
      || die "initdb refuses root and there is no 'postgres' user; could not create the user $pg_user" 3
  fi
  command -v runuser >/dev/null || die "runuser (util-linux) not found: needed to run PostgreSQL as $pg_user" 3
fi

as_pg() {  # run a command as the server's OS user, from <dir> (root's home may not be readable to it)
  if [[ -n $pg_user ]]; then
    (cd "$dir" && runuser -u "$pg_user" -- "$@")
  else
    (cd "$dir" && "$@")
  fi
}

bin=$(bindir || true)

if [[ $action == down ]]; then
  [[ -f $data/postmaster.pid ]] || { echo "postgres.sh: not running ($dir)"; exit 0; }
  [[ -n $bin ]] || die "pg_ctl not found; install postgresql (apt-get install -y postgresql)" 3
  if ! as_pg "$bin/pg_ctl" stop -D "$data" -m fast -w -t 20 >/dev/null 2>&1; then
    if ! as_pg "$bin/pg_ctl" stop -D "$data" -m immediate -w -t 10 >/dev/null 2>&1; then
      pid=$(head -1 "$data/postmaster.pid" 2>/dev/null || true)
      [[ -n $pid ]] && kill -9 "$pid" 2>/dev/null || true
      echo "postgres.sh: PostgreSQL in $dir did not stop in 30 s; killed (pid ${pid:-unknown})" >&2
    fi
  fi
  echo "postgres.sh: stopped ($dir)"
  exit 0
fi
[[ $action == up ]] || die "unknown action '$action'; $usage" 2

[[ -n $bin ]] || die "PostgreSQL server binaries (initdb, pg_ctl) not found; install postgresql (apt-get install -y postgresql)" 3
port=${3:-${SPECSWEEP_PG_PORT:-55432}}
[[ $port =~ ^[0-9]+$ ]] || die "port '$port' is not a number" 2
role=${SPECSWEEP_PG_USER:-specsweep}
db=${SPECSWEEP_PG_DB:-mlflow}
[[ $dir != *[[:space:]]* ]] || die "the directory '$dir' holds a space: PostgreSQL's socket option cannot take it" 2
# a unix socket path is at most 107 bytes: <dir>/.s.PGSQL.<port>
(( ${#dir} + 20 <= 107 )) || die "the directory '$dir' is too long for a unix socket path; use a shorter one (e.g. under /tmp)" 2

mkdir -p "$dir"
if [[ -n $pg_user ]]; then
  chown "$pg_user" "$dir"
  chmod 700 "$dir"
  runuser -u "$pg_user" -- test -w "$dir" \
    || die "the user $pg_user cannot write $dir (a parent folder is not searchable by it); use a folder under /tmp" 3
fi

if [[ -f $dir/password ]]; then
  password=${SPECSWEEP_PG_PASSWORD:-$(cat "$dir/password")}
else
  password=${SPECSWEEP_PG_PASSWORD:-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')}
fi
(umask 077 && printf '%s\n' "$password" >"$dir/password")

if [[ ! -f $data/PG_VERSION ]]; then
  # trust on the unix socket only (it sits in <dir>, mode 700); passwords (SCRAM) over TCP
  as_pg "$bin/initdb" -D "$data" -U postgres --auth-local=trust --auth-host=scram-sha-256 --encoding=UTF8 \
    --no-instructions >"$dir/initdb.log" 2>&1 \
    || { tail -n 20 "$dir/initdb.log" >&2; die "initdb into $data failed (log above: $dir/initdb.log)" 4; }
fi

if as_pg "$bin/pg_ctl" status -D "$data" >/dev/null 2>&1; then
  echo "postgres.sh: already running in $dir" >&2
else
  opts="-c listen_addresses=127.0.0.1 -p $port -c unix_socket_directories=$dir"
  opts+=" -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=100"
  as_pg "$bin/pg_ctl" start -D "$data" -l "$log" -w -t "${SPECSWEEP_PG_START_TIMEOUT:-30}" -o "$opts" >/dev/null 2>&1 \
    || { tail -n 20 "$log" >&2 || true; die "PostgreSQL did not start on 127.0.0.1:$port (waited at most ${SPECSWEEP_PG_START_TIMEOUT:-30} s; log above: $log)" 4; }
fi

# The role (password kept in step with this run's) and its database; psql quotes the values (:'x').
as_pg "$bin/psql" -X -q -h "$dir" -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 \
  -v role="$role" -v pw="$password" -v db="$db" >/dev/null <<'SQL' || die "could not create role/database (see above)" 4
SELECT format('CREATE ROLE %I LOGIN', :'role') WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'role') \gexec
SELECT format('ALTER ROLE %I PASSWORD %L', :'role', :'pw') \gexec
SELECT format('CREATE DATABASE %I OWNER %I', :'db', :'role') WHERE NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = :'db') \gexec
SQL

# What the clients do: a password login over TCP.
PGPASSWORD=$password "$bin/psql" -X -q -h 127.0.0.1 -p "$port" -U "$role" -d "$db" -tAc 'select 1' >/dev/null \
  || die "PostgreSQL runs, but $role cannot log in to $db on 127.0.0.1:$port with its password" 4
uri="postgresql://$role:$password@127.0.0.1:$port/$db"
(umask 077 && printf '%s\n' "$uri" >"$dir/uri")
echo "postgres.sh: PostgreSQL up on 127.0.0.1:$port (data $data, socket in $dir, log $log)" >&2
echo "$uri"
