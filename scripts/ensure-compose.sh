#!/usr/bin/env bash
# Make sure a Docker Compose answers (the v2 plugin `docker compose`, or Debian's docker-compose), for the test that
# has Compose resolve docker-compose.yaml with real .env files (tests/unit/test_compose_file.py). Nothing is started.
source "$(dirname "$0")/lib.sh"

docker compose version >/dev/null 2>&1 && exit 0
docker-compose version >/dev/null 2>&1 && exit 0
apt_install docker-compose
docker-compose version >/dev/null 2>&1 || die "docker-compose does not answer after installing Debian's docker-compose"
say "$(docker-compose version --short 2>/dev/null | sed 's/^/docker-compose /') installed"
