#!/usr/bin/env bash
# Tests for alerting-rules/ with the real Prometheus and Alertmanager tools.
#
# Prerequisites (Debian):
#   apt-get update && apt-get install -y prometheus prometheus-alertmanager
# which provide promtool, amtool and prometheus-alertmanager. No network is
# used; the inhibition check starts Alertmanager on 127.0.0.1 with a null
# receiver and stops it again.
#
# Checks, each counted once in the closing "N passed, M failed" line:
#   promtool check rules / test rules (one per tests/*.yml) / check config,
#   amtool check-config, label+annotation lint and runbook anchor per alert,
#   firing AND not-firing unit tests present per alert, amtool config routes
#   test for every (severity, signal) of the rules plus fixed cases, template
#   rendering (WeChat, DingTalk), DingTalk bridge wiring, no inline secrets,
#   and inhibition on a live Alertmanager.
# Exit status: 0 when every check passed, 1 otherwise, 2 when a tool is missing.
set -u
cd "$(dirname "$0")/.." || exit 2

R=alerting-rules
RUNBOOK=docs/runbook.md
RUNBOOK_BASE=https://github.com/omen-project/omen/blob/main/docs/runbook.md
AM_BIN=${AM_BIN:-prometheus-alertmanager}
AM_PORT=${AM_PORT:-19093}

missing=0
for t in promtool amtool "$AM_BIN"; do
  if ! command -v "$t" >/dev/null 2>&1; then
    echo "missing tool: $t" >&2
    missing=1
  fi
done
if [ "$missing" -ne 0 ]; then
  echo "install with: apt-get update && apt-get install -y prometheus prometheus-alertmanager" >&2
  exit 2
fi

pass=0
fail=0
TMP=$(mktemp -d)
AM_PID=
cleanup() {
  if [ -n "$AM_PID" ]; then kill "$AM_PID" 2>/dev/null; wait "$AM_PID" 2>/dev/null; fi
  rm -rf "$TMP"
}
trap cleanup EXIT

ok() { pass=$((pass + 1)); echo "ok   $1"; }
ko() { fail=$((fail + 1)); echo "FAIL $1"; [ -n "${2:-}" ] && printf '%s\n' "$2" | sed 's/^/     /'; }
# check NAME CMD...: run CMD, pass on exit 0.
check() {
  local name=$1 out rc
  shift
  out=$("$@" 2>&1)
  rc=$?
  if [ "$rc" -eq 0 ]; then ok "$name"; else ko "$name (exit $rc)" "$out"; fi
}

# ------------------------------------------------------------ promtool
check "promtool check rules $R/omen-rules.yml" promtool check rules "$R/omen-rules.yml"
ntests=0
for f in "$R"/tests/*.yml; do
  [ -e "$f" ] || continue
  ntests=$((ntests + 1))
  check "promtool test rules $f" promtool test rules "$f"
done
if [ "$ntests" -gt 0 ]; then ok "rule unit test files found ($ntests)"; else ko "no rule unit tests in $R/tests"; fi
check "promtool check config $R/prometheus.yml" promtool check config "$R/prometheus.yml"

# ------------------------------------------------------------ amtool
check "amtool check-config $R/alertmanager.yml" amtool check-config "$R/alertmanager.yml"

# ------------------------------------------------------------ recording rule names
# Prometheus' convention level:metric:operations: the labels kept, the omen metric, the
# operations newest first (https://prometheus.io/docs/practices/rules/).
bad_records=$(grep -E '^[[:space:]]*- record:' "$R/omen-rules.yml" | awk '{print $3}' |
  grep -vE '^[a-z]+(_[a-z]+)*:omen_[a-z0-9_]+:[a-z0-9_]+$' || true)
nrecords=$(grep -cE '^[[:space:]]*- record:' "$R/omen-rules.yml" || true)
if [ -z "$bad_records" ] && [ "$nrecords" -gt 0 ]; then
  ok "recording rules named level:omen_metric:operations ($nrecords)"
else
  ko "recording rules named level:omen_metric:operations" "$bad_records"
fi

# ------------------------------------------------------------ per-alert lint
# One TSV line per alert: name severity signal summary? description? runbook_url
awk '
  function flush() {
    if (name != "") printf "%s\t%s\t%s\t%s\t%s\t%s\n", name, sev, sig, sum, desc, rb
    name = ""; sev = "-"; sig = "-"; sum = 0; desc = 0; rb = "-"
  }
  BEGIN { name = "" }
  /^[[:space:]]*- (alert|record):/ { flush() }
  /^[[:space:]]*- alert:/ { name = $3 }
  name != "" && /^[[:space:]]+severity:/    { sev = $2 }
  name != "" && /^[[:space:]]+signal:/      { s = $0; sub(/^[[:space:]]+signal:[[:space:]]*/, "", s); gsub(/"/, "", s); sig = s }
  name != "" && /^[[:space:]]+summary:/     { sum = 1 }
  name != "" && /^[[:space:]]+description:/ { desc = 1 }
  name != "" && /^[[:space:]]+runbook_url:/ { rb = $2 }
  END { flush() }
' "$R/omen-rules.yml" > "$TMP/alerts.tsv"

nalerts=$(wc -l < "$TMP/alerts.tsv")
if [ "$nalerts" -gt 0 ]; then ok "alerts found in omen-rules.yml ($nalerts)"; else ko "no alerts parsed from omen-rules.yml"; fi

# Which alerts have a firing and a not-firing case in the unit tests.
awk '
  /^[[:space:]]*alertname:/ { a = $2; want = 1; next }
  want == 1 && /^[[:space:]]*exp_alerts:[[:space:]]*\[\][[:space:]]*$/ { print a "\tnot_firing"; want = 0; next }
  want == 1 && /^[[:space:]]*exp_alerts:[[:space:]]*$/ { want = 2; next }
  want == 2 && /^[[:space:]]*- exp_labels:/ { print a "\tfiring"; want = 0; next }
  /^[[:space:]]*[^[:space:]#]/ { want = 0 }
' "$R"/tests/*.yml | sort -u > "$TMP/covered.tsv"

while IFS=$'\t' read -r name sev sig sum desc rb; do
  problems=
  case "$sev" in warning|critical) ;; *) problems="$problems severity='$sev';" ;; esac
  [ "$sig" != "-" ] && [ -n "$sig" ] || problems="$problems no signal label;"
  [ "$sum" = 1 ] || problems="$problems no summary;"
  [ "$desc" = 1 ] || problems="$problems no description;"
  anchor=$(printf '%s' "$name" | tr '[:upper:]' '[:lower:]')
  [ "$rb" = "$RUNBOOK_BASE#$anchor" ] || problems="$problems runbook_url '$rb' is not $RUNBOOK_BASE#$anchor;"
  if [ -z "$problems" ]; then ok "$name: labels and annotations"; else ko "$name: labels and annotations" "$problems"; fi

  # GitHub anchors come from headings: "## OmenFoo" -> #omenfoo.
  if grep -Eq "^#{2,3} ${name}[[:space:]]*$" "$RUNBOOK" 2>/dev/null; then
    ok "$name: runbook section $RUNBOOK#$anchor"
  else
    ko "$name: runbook section" "no heading '## $name' in $RUNBOOK"
  fi

  miss=
  grep -q "^$name	firing$" "$TMP/covered.tsv" || miss="$miss firing"
  grep -q "^$name	not_firing$" "$TMP/covered.tsv" || miss="$miss not-firing"
  if [ -z "$miss" ]; then ok "$name: unit tests cover firing and not firing"; else ko "$name: unit tests" "missing case(s):$miss"; fi
done < "$TMP/alerts.tsv"

# ------------------------------------------------------------ routing
expected_receivers() { # severity signal
  case "$1" in
    critical) echo "dingtalk-critical,pager-critical" ;;
    warning) if [ "$2" = forecast ]; then echo wechat-capacity; else echo wechat-warning; fi ;;
    *) echo wechat-warning ;;
  esac
}
route_test() { # expected labels...
  local exp=$1
  shift
  check "route {$*} -> $exp" amtool config routes test --config.file="$R/alertmanager.yml" --verify.receivers="$exp" "$@"
}
# Every alert of the rules; a templated signal label is tried with each signal.
ANOMALY_SIGNALS="tle rci kvf kv_usage ttft vram"
while IFS=$'\t' read -r name sev sig _; do
  case "$sig" in
    *'{{'*) sigs=$ANOMALY_SIGNALS ;;
    *) sigs=$sig ;;
  esac
  for s in $sigs; do
    route_test "$(expected_receivers "$sev" "$s")" alertname="$name" severity="$sev" signal="$s" instance=omen-a:9465
  done
done < "$TMP/alerts.tsv"
# Fixed cases: plain severity/signal pairs and the fallback.
for s in tle rci kvf kv_usage vram ttft health source agent; do
  route_test wechat-warning severity=warning signal="$s"
  route_test dingtalk-critical,pager-critical severity=critical signal="$s"
done
route_test wechat-capacity severity=warning signal=forecast slo=kvf
route_test dingtalk-critical,pager-critical severity=critical signal=forecast slo=kvf
route_test wechat-warning alertname=SomethingElse severity=info
route_test wechat-warning alertname=NoSeverity signal=kvf
# The routing tree must also reject a wrong expectation (guards against a
# --verify.receivers that silently accepts anything).
if amtool config routes test --config.file="$R/alertmanager.yml" --verify.receivers=wechat-warning severity=critical signal=kvf >/dev/null 2>&1; then
  ko "route test rejects a wrong receiver" "critical was accepted as wechat-warning"
else
  ok "route test rejects a wrong receiver"
fi

# ------------------------------------------------------------ templates
render_check() { # name glob template expected-substring...
  local name=$1 glob=$2 tmpl=$3 out rc miss=
  shift 3
  out=$(amtool template render --template.glob="$glob" --template.text="{{ template \"$tmpl\" . }}" \
    --template.data="$R/tests/template-data.json" 2>&1)
  rc=$?
  for want in "$@"; do
    printf '%s' "$out" | grep -qF -- "$want" || miss="$miss [$want]"
  done
  if [ "$rc" -eq 0 ] && [ -z "$miss" ]; then ok "$name"; else ko "$name" "exit $rc, missing:$miss
$out"; fi
}
RB_URL="$RUNBOOK_BASE#omenkvcacheusagecritical"
render_check "template omen.wechat.message renders" "$R/templates/*.tmpl" omen.wechat.message \
  "[FIRING 1]" "KV cache of layer 0 is full" "resolved: 2025-01-02 04:00:00 UTC" "$RB_URL"
render_check "template omen.dingtalk.title renders" "$R/dingtalk/*.tmpl" omen.dingtalk.title \
  "[FIRING 1] OmenKVCacheUsageCritical (kv_usage)"
render_check "template omen.dingtalk.content renders" "$R/dingtalk/*.tmpl" omen.dingtalk.content \
  "### [FIRING 1] OmenKVCacheUsageCritical" "severity: **critical**" "instance: omen-a:9465" "$RB_URL"
if grep -q 'template "omen.wechat.message"' "$R/alertmanager.yml"; then
  ok "alertmanager.yml uses omen.wechat.message"
else
  ko "alertmanager.yml does not use omen.wechat.message"
fi

# ------------------------------------------------------------ DingTalk bridge wiring
# alertmanager posts to http://127.0.0.1:8060/dingtalk/<target>/send; the target
# must exist in dingtalk-config.yml, and its templates must be defined.
dt_target=$(grep -Eo 'http://127\.0\.0\.1:8060/dingtalk/[A-Za-z][A-Za-z0-9_-]*/send' "$R/alertmanager.yml" | head -1 | cut -d/ -f5)
if [ -n "$dt_target" ] && grep -Eq "^  $dt_target:[[:space:]]*$" "$R/dingtalk-config.yml" \
  && awk -v t="$dt_target" '$0 ~ "^  "t":" {f=1; next} f && /^  [^ ]/ {f=0} f && /^    url: https:\/\//' "$R/dingtalk-config.yml" | grep -q .; then
  ok "dingtalk target '$dt_target' exists with a url"
else
  ko "dingtalk bridge wiring" "alertmanager.yml target '${dt_target:-none}' not defined (with url) in dingtalk-config.yml"
fi
miss=
while read -r t; do
  grep -q "define \"$t\"" "$R"/dingtalk/*.tmpl || miss="$miss $t"
done < <(grep -Eo 'template "[^"]+"' "$R/dingtalk-config.yml" | cut -d'"' -f2 | sort -u)
if [ -z "$miss" ]; then ok "dingtalk-config.yml templates are defined in dingtalk/*.tmpl"; else ko "dingtalk templates undefined:$miss"; fi

# ------------------------------------------------------------ secrets
bad=$(grep -nE '^[[:space:]]*(wechat_api_secret|api_secret|secret|credentials|password):' "$R/alertmanager.yml" "$R/dingtalk-config.yml" \
  | grep -vE ':[[:space:]]*(__[A-Z0-9_]+__)[[:space:]]*$')
bad2=$(grep -nE 'access_token=' "$R/alertmanager.yml" "$R/dingtalk-config.yml" | grep -v 'access_token=__[A-Z0-9_]*__')
if [ -z "$bad$bad2" ]; then ok "no inline secrets (placeholders only)"; else ko "inline secrets" "$bad$bad2"; fi

# ------------------------------------------------------------ inhibition, live
# The real inhibit_rules block, a null receiver, Alertmanager on loopback.
{
  cat <<'EOF'
route:
  receiver: "null"
  group_by: [alertname, signal]
  group_wait: 1h
receivers:
  - name: "null"
EOF
  awk '/^inhibit_rules:/ {f = 1; print; next} f && /^[^[:space:]#]/ {f = 0} f' "$R/alertmanager.yml"
} > "$TMP/am-inhibit.yml"
# First free loopback port from AM_PORT on (bash's /dev/tcp connects if something listens).
port=$AM_PORT
while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 1)); done
AM_ADDR=127.0.0.1:$port
U="--alertmanager.url=http://$AM_ADDR"
"$AM_BIN" --config.file="$TMP/am-inhibit.yml" --storage.path="$TMP/am-data" \
  --web.listen-address="$AM_ADDR" --cluster.listen-address= > "$TMP/am.log" 2>&1 &
AM_PID=$!
up=0
for _ in $(seq 1 50); do
  if ! kill -0 "$AM_PID" 2>/dev/null; then break; fi
  if amtool "$U" config show >/dev/null 2>&1; then up=1; break; fi
  sleep 0.2
done
if [ "$up" -ne 1 ]; then
  ko "alertmanager started on $AM_ADDR" "$(cat "$TMP/am.log")"
else
  ok "alertmanager started on $AM_ADDR"
  add() { amtool "$U" alert add "$@" >/dev/null 2>&1 || echo "alert add failed: $*"; }
  errs=
  # severity signal instance extra-label -> expected: inhibited | active
  errs+=$(add OmenKVCacheUsageCritical severity=critical signal=kv_usage instance=a layer=0)
  errs+=$(add OmenKVCacheUsageHigh severity=warning signal=kv_usage instance=a layer=0)
  errs+=$(add OmenKVCacheUsageHigh severity=warning signal=kv_usage instance=a layer=1)
  errs+=$(add OmenKVCacheUsageHigh severity=warning signal=kv_usage instance=b layer=0)
  errs+=$(add OmenKVFragmentationHigh severity=warning signal=kvf instance=a layer=0)
  errs+=$(add OmenHealthCritical severity=critical signal=health instance=a)
  errs+=$(add OmenHealthWarning severity=warning signal=health instance=a)
  errs+=$(add OmenSLOBreachImminent severity=critical signal=forecast instance=a slo=vram_headroom)
  errs+=$(add OmenSLOBreachForecast severity=warning signal=forecast instance=a slo=vram_headroom)
  errs+=$(add OmenSLOBreachForecast severity=warning signal=forecast instance=a slo=kvf)
  if [ -z "$errs" ]; then ok "alerts posted to alertmanager"; else ko "alerts posted to alertmanager" "$errs"; fi
  sleep 0.5
  amtool "$U" alert query --inhibited -o extended > "$TMP/inhibited.txt" 2>&1
  amtool "$U" alert query --active -o extended > "$TMP/active.txt" 2>&1
  inhibit_case() { # expected-state labelset (amtool's sorted label rendering)
    local state=$1 ls=$2 file
    if [ "$state" = inhibited ]; then file=$TMP/inhibited.txt; else file=$TMP/active.txt; fi
    if grep -qF -- "$ls " "$file"; then ok "inhibition: {$ls} is $state"; else ko "inhibition: {$ls} should be $state" "$(cat "$TMP/inhibited.txt")"; fi
  }
  inhibit_case inhibited 'alertname="OmenKVCacheUsageHigh" instance="a" layer="0" severity="warning" signal="kv_usage"'
  inhibit_case active    'alertname="OmenKVCacheUsageHigh" instance="a" layer="1" severity="warning" signal="kv_usage"'
  inhibit_case active    'alertname="OmenKVCacheUsageHigh" instance="b" layer="0" severity="warning" signal="kv_usage"'
  inhibit_case active    'alertname="OmenKVFragmentationHigh" instance="a" layer="0" severity="warning" signal="kvf"'
  inhibit_case inhibited 'alertname="OmenHealthWarning" instance="a" severity="warning" signal="health"'
  inhibit_case active    'alertname="OmenHealthCritical" instance="a" severity="critical" signal="health"'
  inhibit_case inhibited 'alertname="OmenSLOBreachForecast" instance="a" severity="warning" signal="forecast" slo="vram_headroom"'
  inhibit_case active    'alertname="OmenSLOBreachForecast" instance="a" severity="warning" signal="forecast" slo="kvf"'
  n_inh=$(grep -c 'suppressed' "$TMP/inhibited.txt")
  if [ "$n_inh" -eq 3 ]; then ok "exactly 3 alerts inhibited"; else ko "exactly 3 alerts inhibited" "got $n_inh: $(cat "$TMP/inhibited.txt")"; fi
fi

echo
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
