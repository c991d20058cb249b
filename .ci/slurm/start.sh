#!/usr/bin/env bash
# Start a one-node Slurm on this machine (munged, slurmctld, slurmd) from .ci/slurm/slurm.conf.in.
# Idempotent: what is already running is left alone. Prints what it did; exits non-zero when `sbatch`
# cannot reach a working controller at the end (CI then fails instead of skipping the Slurm tests).
# Installs the Debian packages when sbatch is missing and apt-get is there (root, as in CI).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
say() { echo "slurm: $*" >&2; }
if ! command -v slurmctld >/dev/null 2>&1 || ! command -v sbatch >/dev/null 2>&1; then
  say "installing slurmctld slurmd slurm-client munge"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurmctld slurmd slurm-client munge \
    >/dev/null) || { say "apt-get install failed"; exit 1; }
fi
host="$(hostname -s)"
cpus="${SLURM_CI_CPUS:-2}"
mem="$(awk '/MemTotal/ {print int($2 / 1024 * 0.8)}' /proc/meminfo)"
mkdir -p /tmp/slurm/state /tmp/slurm/spool /etc/slurm
conf=/etc/slurm/slurm.conf
sed -e "s/@HOST@/$host/g" -e "s/@CPUS@/$cpus/g" -e "s/@MEM@/$mem/g" "$here/slurm.conf.in" > "$conf.new"
if ! cmp -s "$conf.new" "$conf" 2>/dev/null; then
  mv "$conf.new" "$conf"; say "wrote $conf (node $host, $cpus CPUs, ${mem} MB)"; changed=1
else
  rm -f "$conf.new"; changed=0
fi
if ! pgrep -x munged >/dev/null; then
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  [ -s /etc/munge/munge.key ] || { dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; say "made a munge key"; }
  chown -R munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge
  chmod 0700 /etc/munge; chmod 0400 /etc/munge/munge.key
  runuser -u munge -- /usr/sbin/munged
  say "started munged"
fi
if [ "$changed" = 1 ]; then  # a new config: restart the daemons on it
  for d in slurmd slurmctld; do pid="$(cat /tmp/slurm/$d.pid 2>/dev/null || true)"
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill "$pid"; say "stopped $d ($pid) for the new config"; sleep 1; fi
  done
fi
if ! pgrep -x slurmctld >/dev/null; then /usr/sbin/slurmctld -c; say "started slurmctld"; fi
if ! pgrep -x slurmd >/dev/null; then /usr/sbin/slurmd; say "started slurmd"; fi
for _ in $(seq 30); do
  if sinfo -h -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
    say "up: $(sinfo -h -o '%P %D %T %c CPUs')"
    exit 0
  fi
  scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true
  sleep 1
done
say "controller or node not up after 30 s; sinfo says: $(sinfo 2>&1 | tr '\n' ' ')"
tail -5 /tmp/slurm/slurmctld.log /tmp/slurm/slurmd.log >&2 2>/dev/null || true
exit 1
