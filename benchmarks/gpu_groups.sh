#!/usr/bin/env bash
# Group creation on NCCL (issue 50), for the device machine: 4 NCCL ranks on one GPU (each its
# own NCCL_HOSTID), under nccl-doctor run, the broken scenarios of
# tests/integration/jobs/group_creation.py and a healthy twin. Writes each run's report.json
# and console output under $OUT (or /tmp/gpu_groups). Needs py-spy, jinja2, prometheus_client
# installable from $WHEELS (a folder of wheels) when missing.
set -u
OUT=${OUT:-/tmp/gpu_groups}
WHEELS=${WHEELS:-.gpuwheels}
if [ -d "$WHEELS" ]; then
  python -m pip install -q --no-index --find-links "$WHEELS" py-spy jinja2 prometheus_client \
    >/dev/null 2>&1 || echo "wheels: some could not be installed"
fi
python -c "import nccl_doctor.reproducers" 2>/dev/null || \
  python -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || \
  echo "could not install nccl-doctor here"
export NCCL_SOCKET_IFNAME=lo BACKEND=nccl GLOO_TIMEOUT_S=120
mkdir -p "$OUT"; nvidia-smi -L
for sc in members_only mesh_subset healthy; do
  start=$(date +%s.%N)
  SCENARIO=$sc timeout 150 python -m nccl_doctor run --force --out "$OUT/$sc" -- \
    python -m torch.distributed.run --standalone --nproc-per-node 4 \
    tests/integration/jobs/group_creation.py >"$OUT/$sc.console.txt" 2>&1
  rc=$?
  end=$(date +%s.%N)
  python - "$OUT/$sc/report.json" "$sc" "$rc" "$start" "$end" <<'PY'
import json, sys
path, sc, rc, start, end = sys.argv[1:]
try:
    r = json.load(open(path))
except Exception as err:
    print(f"{sc}: rc={rc} no report ({err})"); raise SystemExit
root = next((f for f in r["findings"] if f.get("root_cause")), None)
w = r.get("watchdog") or {}
print(f"{sc}: rc={rc} verdict={r['verdict']} wall={float(end) - float(start):.1f}s "
      f"watchdog={w.get('how')} waited_s={w.get('waited_s')}")
if root:
    print(f"  root {root['kind']}: {root['title']}")
    print("  " + root["detail"].replace("\n", "\n  "))
PY
  cp "$OUT/$sc/report.json" "$OUT/$sc.report.json" 2>/dev/null
done
