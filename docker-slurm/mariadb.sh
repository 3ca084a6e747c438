# The test clusters' private MariaDB server for slurmdbd (sourced by cluster.sh and multinode.sh).
#
# The caller sets MARIADBD, MARIADB_INSTALL_DB, MARIADB_ADMIN, DB_USER, DB_DIR, DB_SOCKET,
# DB_PIDFILE, LOG, STATE, MARK_VAR and TIMEOUT, and defines die and alive. The server is the
# host's binary with none of the host's settings (--no-defaults) and no TCP (--skip-networking):
# only its socket under $STATE, which the cluster's namespaces and root see.

db_ping() {
    "$MARIADB_ADMIN" --no-defaults --socket="$DB_SOCKET" --connect-timeout=2 ping >/dev/null 2>&1
}

start_mariadb() {
    local i
    alive "$DB_PIDFILE" && db_ping && return 0
    mkdir -p "$DB_DIR"
    chown "$DB_USER:" "$DB_DIR"
    chmod 750 "$DB_DIR"
    if [[ ! -d $DB_DIR/data/mysql ]]; then
        # Root may log in only through the socket, as the OS user root: no password to keep.
        "$MARIADB_INSTALL_DB" --no-defaults --user="$DB_USER" --datadir="$DB_DIR/data" \
            --auth-root-authentication-method=socket --skip-test-db >"$LOG/mariadb-install-db.log" 2>&1 \
            || die "mariadb-install-db failed; last lines of $LOG/mariadb-install-db.log:"$'\n'"$(tail -n 20 "$LOG/mariadb-install-db.log")"
    fi
    touch "$LOG/mariadbd.log"
    chown "$DB_USER:" "$LOG/mariadbd.log"
    # mariadbd does not detach by itself; setsid keeps it out of the caller's process group and
    # the closed descriptors keep a caller reading our output from waiting for it.
    env "$MARK_VAR=$STATE" setsid "$MARIADBD" --no-defaults --user="$DB_USER" --datadir="$DB_DIR/data" \
        --socket="$DB_SOCKET" --pid-file="$DB_PIDFILE" --skip-networking --log-error="$LOG/mariadbd.log" \
        --innodb-buffer-pool-size=64M --innodb-lock-wait-timeout=900 </dev/null >/dev/null 2>&1 &
    for ((i = 0; i < TIMEOUT * 5; i++)); do
        alive "$DB_PIDFILE" && db_ping && return 0
        sleep 0.2
    done
    die "mariadbd did not answer on $DB_SOCKET after ${TIMEOUT}s; last lines of its log:"$'\n'"$(tail -n 20 "$LOG/mariadbd.log" 2>/dev/null)"
}
