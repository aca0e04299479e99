#!/usr/bin/env bash
# A dedicated sshd on 127.0.0.1:2222 (key auth only) so SSH host validation is tested for real.
# Its host key, client key and known_hosts live in /var/lib/fleetbench/sshd/; the system sshd is untouched.
source "$(dirname "$0")/lib.sh"

DIR="${FLEETBENCH_SSHD_DIR:-/var/lib/fleetbench/sshd}"  # shared by every checkout on this machine
PORT="${FLEETBENCH_SSHD_PORT:-2222}"
sshd_ok() { ssh -q -o BatchMode=yes -o UserKnownHostsFile="$DIR/known_hosts" -o StrictHostKeyChecking=yes \
  -o ConnectTimeout=3 -i "$DIR/client_key" -p "$PORT" root@127.0.0.1 true; }

mkdir -p "$DIR"
[ -f "$DIR/client_key" ] && sshd_ok && exit 0
apt_install openssh-server openssh-client
[ -f "$DIR/host_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -f "$DIR/host_ed25519"
[ -f "$DIR/client_key" ] || ssh-keygen -q -t ed25519 -N '' -f "$DIR/client_key" -C fleetbench-test
cp "$DIR/client_key.pub" "$DIR/authorized_keys"
chmod 600 "$DIR/authorized_keys" "$DIR/host_ed25519" "$DIR/client_key"
echo "[127.0.0.1]:$PORT $(cut -d' ' -f1,2 "$DIR/host_ed25519.pub")" >"$DIR/known_hosts"
cat >"$DIR/sshd_config" <<CFG
Port $PORT
ListenAddress 127.0.0.1
HostKey $DIR/host_ed25519
PidFile $DIR/sshd.pid
AuthorizedKeysFile $DIR/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
AcceptEnv LANG LC_*
Subsystem sftp internal-sftp
CFG
mkdir -p /run/sshd
# An earlier sshd of ours that no longer answers: stopped, if the pid is still that sshd (after a reboot or a long
# uptime the pid in the file may be any other process's).
if [ -f "$DIR/sshd.pid" ]; then
  pid="$(cat "$DIR/sshd.pid")"
  # read whole before grep: grep -q closing the pipe early could fail the pipeline (pipefail) and spare our sshd
  cmdline="$( (tr '\0' ' ' <"/proc/$pid/cmdline") 2>/dev/null || true)"
  if [ -n "$pid" ] && grep -qF -- "-f $DIR/sshd_config" <<<"$cmdline"; then
    kill "$pid"; sleep 0.5
  fi
  rm -f "$DIR/sshd.pid"
fi
/usr/sbin/sshd -f "$DIR/sshd_config" -E "$DIR/sshd.log"
wait_for 15 sshd sshd_ok || die "sshd on 127.0.0.1:$PORT does not accept the test key; see $DIR/sshd.log"
say "sshd answers on 127.0.0.1:$PORT (key: $DIR/client_key)"
