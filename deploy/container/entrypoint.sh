#!/bin/sh
# Entrypoint of the RocketQ image: `rocketq-entrypoint SERVICE [ARGS...]`, SERVICE one of
# nameserver, broker, timer-wheel; anything else runs as a command (`rocketq-entrypoint rocketq
# produce ...`, `rocketq-entrypoint sh`). Every configuration key comes from the environment
# (ROCKETQ_<SERVICE>_<KEY>, services/common/config.py); this script only derives what a
# StatefulSet cannot put in a pod template, from the pod's ordinal (the number ending its
# hostname, e.g. rocketq-broker-2 -> 2):
#   broker: ROCKETQ_BROKER_BROKERNAME = ${ROCKETQ_BROKER_NAME_PREFIX}-<ordinal>, unless set.
set -eu
service="${1:-nameserver}"
[ "$#" -gt 0 ] && shift
host="${POD_NAME:-$(hostname)}"
ordinal="${host##*-}"
case "$ordinal" in
    ''|*[!0-9]*) ordinal="" ;;
esac
case "$service" in
    nameserver)
        exec python3 -m services.nameserver "$@" ;;
    timer-wheel)
        exec python3 -m services.timer_wheel "$@" ;;
    broker)
        if [ -z "${ROCKETQ_BROKER_BROKERNAME:-}" ] && [ -n "${ROCKETQ_BROKER_NAME_PREFIX:-}" ]; then
            if [ -z "$ordinal" ]; then
                echo "rocketq-entrypoint: cannot derive brokerName: '$host' does not end in -<ordinal>" >&2
                exit 2
            fi
            export ROCKETQ_BROKER_BROKERNAME="${ROCKETQ_BROKER_NAME_PREFIX}-${ordinal}"
        fi
        # not a configuration key: the broker would refuse it as unknown
        unset ROCKETQ_BROKER_NAME_PREFIX
        exec python3 -m services.broker "$@" ;;
    *)
        exec "$service" "$@" ;;
esac
