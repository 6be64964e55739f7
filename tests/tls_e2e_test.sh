#!/usr/bin/env bash
# The mesh under mutual TLS and a token, end to end: a cluster YAML with a
# tls block (certificates from scripts/make_test_certs.sh) launches every
# role; the CLI submits a short GRPO experiment over TLS and it succeeds
# (the rollout worker reaches the buffer and the reward server, the learner
# the buffer, the coordinator every role, all verified). Then every service
# and its health check are called with each wrong kind of client
# (tests/tls_refusal_check.py): plaintext, no client certificate, a rogue
# one, a client that cannot verify the server, no token.
set -uo pipefail
fail() { echo "tls_e2e_test: FAIL: $*" >&2; exit 1; }
PY="${RLMESH_PYTHON:-python3}"
PY="$("$PY" -c 'import sys; print(sys.executable)')"
ROOT="$TEST_SRCDIR/$TEST_WORKSPACE"
C="$ROOT/coordinator/coordinator"
W="$TEST_TMPDIR/tls"
mkdir -p "$W"
cd "$W"
bash "$ROOT/scripts/make_test_certs.sh" certs >/dev/null || fail "could not make certificates (openssl)"
printf 'tls-e2e-token' > token
cat > cluster.yaml <<YAML
name: tls
rollout_workers: 1
reward_servers: 1
learners: 1
run_dir: $W/run
auth_token_file: $W/token
tls: {cert_file: certs/node.pem, key_file: certs/node.key, root_cert_file: certs/ca.pem, mutual: true}
YAML
"$C" launch --cluster=cluster.yaml --bin_dir="$ROOT" --port_file="$W/coord.port" > launch.log 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; sleep 1; kill -9 $pid 2>/dev/null' EXIT
for _ in $(seq 120); do [ -s coord.port ] && break; kill -0 $pid 2>/dev/null || break; sleep 0.5; done
[ -s coord.port ] || fail "coordinator did not start: $(tail -n 20 launch.log)"
P=$(cat coord.port)
for role in replay_buffer reward-0 rollout-0 learner-0; do
  grep -q "listening on .*(token auth) (mutual tls)" "run/logs/$role.log" || fail "$role is not serving mutual TLS"
done
grep -q "coordinator listening on .*(token auth) (mutual tls)" launch.log || fail "the coordinator is not serving mutual TLS"

TLS=(--address="127.0.0.1:$P" --auth_token_file=token --tls_root_cert=certs/ca.pem --tls_cert=certs/node.pem
     --tls_key=certs/node.key --tls_mutual)
id=$("$C" submit "$ROOT/configs/grpo_arith_e2e.yaml" "${TLS[@]}" --set=rollout.workers=1 --set=rollout.max_batch=0 \
      --set='stages[0].sft.steps=30' --set='stages[0].sft.until.after=10' --set='stages[0].sft.until.eval_accuracy=0.99' \
      --set='stages[1].grpo.rl.steps=3' --set=logging.tensorboard=false 2>&1 | tail -n1)
[[ "$id" == grpo_arith_e2e-* ]] || fail "submit over mutual TLS failed: $id"
state=""
for _ in $(seq 300); do
  state=$("$C" status "${TLS[@]}" "$id" 2>&1 | head -n1)
  [[ "$state" == *SUCCEEDED* || "$state" == *FAILED* || "$state" == *CANCELLED* ]] && break
  sleep 1
done
[[ "$state" == *SUCCEEDED*"step=3/3"* ]] || fail "experiment did not succeed over TLS: $state; $(tail -n 20 launch.log)"
echo "tls_e2e_test: $state"
# The CLI without the certificates is refused.
"$C" status --address="127.0.0.1:$P" --auth_token_file=token >/dev/null 2>&1 && fail "a plaintext CLI got in"

port() { cat "run/ports/$1.port"; }
"$PY" "$ROOT/tests/tls_refusal_check.py" certs tls-e2e-token \
  coordinator=coordinator@127.0.0.1:$P learner-0=learner@127.0.0.1:$(port learner-0) \
  replay_buffer=replay_buffer@127.0.0.1:$(port replay_buffer) reward-0=reward_server@127.0.0.1:$(port reward-0) \
  rollout-0=rollout_worker@127.0.0.1:$(port rollout-0) 2>&1 | grep '^tls_refusal_check:'
[ "${PIPESTATUS[0]}" = 0 ] || fail "a client that should be refused was not (see above)"
echo "tls_e2e_test: PASS"
