# What .ci/run (CI) and .ci/nightly share: the time limit, stages and their times, the install, pytest's
# exit status, interpreters, and the lab checks. Sourced (bash), never run.

# --- the time limit ---------------------------------------------------------------------------------
# ci_limit SECONDS SCRIPT ARGS...: run SCRIPT under `timeout` (its whole process group: a stage in progress is
# stopped too, then the script's EXIT trap tears the labs down) unless it already runs under one; past the
# limit, say so plainly and fail. Returns only in the limited run.
ci_limit() {
    local limit=$1 script=$2 rc=0
    shift 2
    [[ -n ${SAN_CI_LIMITED:-} ]] && return 0
    SAN_CI_LIMITED=1 timeout --signal=TERM --kill-after=300 "$limit" bash "$script" "$@" || rc=$?
    if [[ $rc -eq 124 || $rc -eq 137 ]]; then
        echo "ci: FAILED: $(basename "$script") was still running after $((limit / 60)) min, its limit; it was" \
             "stopped (the stage times above say where the time went)" >&2
        exit 1
    fi
    exit "$rc"
}

# --- stages and their times -------------------------------------------------------------------------
# `stage NAME` starts a stage of the current pipeline (ci_pipeline: "host", or "lab" for the lab stages that
# run beside the host stages); every stage is written to one file, and ci_summary prints each stage's time
# and the total, also when the run failed or was stopped.
ci_pipeline=host
ci_start=$SECONDS
ci_stages=$(mktemp /tmp/pytest-san-ci-stages.XXXXXX)
stage_start=$SECONDS
stage() {
    echo "ci: [$((SECONDS - ci_start)) s] $* (previous stage: $((SECONDS - stage_start)) s)"
    stage_start=$SECONDS
    printf '%s\t%s\t%s\n' "$ci_pipeline" "$SECONDS" "$*" >> "$ci_stages"
}
stage_done() {  # the current pipeline has finished its last stage
    printf '%s\t%s\t%s\n' "$ci_pipeline" "$SECONDS" "-" >> "$ci_stages"
}
ci_summary() {
    local total=$((SECONDS - ci_start))
    echo "ci: stage times (the host and lab pipelines run side by side):"
    awk -F '\t' -v now="$SECONDS" -v t0="$ci_start" '
        { pipe[NR] = $1; at[NR] = $2; name[NR] = $3 }
        END {
            for (i = 1; i <= NR; i++) {
                if (name[i] == "-") continue
                end = -1
                for (j = i + 1; j <= NR; j++) if (pipe[j] == pipe[i]) { end = at[j]; break }
                note = ""
                if (end < 0) { end = now; note = "  (did not finish)" }
                printf "ci:   %-6s %6d s  (at %5d s)  %s%s\n", "[" pipe[i] "]", end - at[i], at[i] - t0, name[i], note
            }
        }' "$ci_stages"
    printf 'ci: total %d min %02d s (%d s)\n' $((total / 60)) $((total % 60)) "$total"
    rm -f "$ci_stages"
}

# --- the install --------------------------------------------------------------------------------------
ci_install() {
    if [[ ! -x .venv/bin/python ]]; then
        python3 -m venv .venv
    fi
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e '.[dev,lab]'
    export PATH="$PWD/.venv/bin:$PATH"
    # System packages: sshd for the hil tests; qemu, rdma-core, pyverbs, perftest for the lab.
    if [[ $(id -u) -eq 0 ]]; then
        PYTHON=.venv/bin/python sh hil/lab/install.sh > ci-install.log 2>&1 || { cat ci-install.log; exit 1; }
        # Debian's Chromium: the browser checks of pytest-html's report and nightly's index.html.
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >> ci-install.log 2>&1 || { cat ci-install.log; exit 1; }
    else
        echo "ci: not root: hil/lab/install.sh skipped (the sshd tests skip, and the lab stage needs its packages)" >&2
    fi
}

# pytest exits 5 when it collected nothing: for CI that is a failure, not a pass.
run_pytest() {
    local rc=0
    "$@" || rc=$?
    if [[ $rc -eq 5 ]]; then
        echo "ci: no tests were collected by: $*" >&2
        exit 5
    elif [[ $rc -ne 0 ]]; then
        echo "ci: failed (exit $rc): $*" >&2
        exit "$rc"
    fi
}

# python3.X (X = $1) for the tox matrix and the agent's floor: pyenv's (CI machines have CPython 3.9-3.13 at
# $(pyenv root)/versions/3.X.Y/bin), else one on PATH or in /usr/bin; a pyenv shim for a version that is not
# selected fails the check and is passed over. Prints the path; fails when there is none.
find_python() {
    local minor=$1 root candidate
    root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
    for candidate in "$root"/versions/3."$minor".*/bin/python3."$minor" "$(command -v python3."$minor" || true)" \
                     /usr/bin/python3."$minor" /usr/local/bin/python3."$minor"; do
        if [[ -n $candidate && -x $candidate ]] &&
            "$candidate" -c "import sys; sys.exit(sys.version_info[:2] != (3, $minor))" 2>/dev/null; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}

# tox ENVS... in the unpacked sdist $tox_root (each env: a wheel built from the sdist, the suite and the sdist's
# fast tests), the interpreters found first on its PATH, within $tox_budget seconds. ENVS name py3X-pytestN;
# those whose interpreter is missing are said and left out.
run_tox() {
    local env minor tox_path="" envs="" missing="" python rc=0
    for env in "$@"; do
        minor=${env#py3}
        minor=${minor%%-*}
        if python=$(find_python "$minor"); then
            [[ $tox_path == *"$(dirname "$python"):"* ]] || tox_path="$tox_path$(dirname "$python"):"
            envs="$envs${envs:+,}$env"
        else
            missing="$missing $env"
        fi
    done
    echo "ci: tox envs: ${envs:-none}; no interpreter for:${missing:- none}"
    [[ -n $envs ]] || { echo "ci: no interpreter for the tox matrix" >&2; exit 1; }
    PATH="$tox_path$PATH" SAN_PYTHON39=${python39:-} timeout --signal=INT --kill-after=60 "$tox_budget" \
        .venv/bin/tox p -c "$tox_root/tox.ini" -p auto --parallel-no-spinner -e "$envs" || rc=$?
    if [[ $rc -eq 124 ]]; then
        echo "ci: the tox matrix went over its budget of $tox_budget s" >&2
        exit 1
    elif [[ $rc -ne 0 ]]; then
        echo "ci: the tox matrix failed (exit $rc)" >&2
        exit "$rc"
    fi
    echo "ci: tox passed in the unpacked sdist: $envs"
}

# --- the lab checks -----------------------------------------------------------------------------------
# Every provider rule must have passed on real verbs (a rule that was only skipped does not count).
check_rules() {
    .venv/bin/python - "$1" "$2" <<'EOF'
import json, sys
rules = json.load(open(sys.argv[1]))["rules"]
bad = [r for r in (f"R{i}" for i in range(1, 15)) if rules[r]["failed"] or not rules[r]["passed"]]
if bad:
    sys.exit(f"ci: on {sys.argv[2]} these rules did not pass: {', '.join(bad)}")
print(f"ci: R1-R14 all passed on {sys.argv[2]}")
EOF
}

# The reference model on real verbs with the emulator replaying every sequence beside it (differential):
# $1 inventory, $2 sequences, $3 seed (one known to pass, so a red CI means a change broke something;
# empty: a fresh one, to hunt), $4 report. Fails on any undocumented divergence.
run_model() {
    run_pytest .venv/bin/pytest -q --pyargs pytest_san.model --san-backend=hil \
        --san-inventory="$1" --san-model-differential --san-model-sequences "$2" --san-model-steps 20 \
        ${3:+--san-model-seed "$3"} --san-report "$4"
    .venv/bin/python - "$4" "$2" <<'EOF'
import json, sys
model = json.load(open(sys.argv[1]))["model"]
if model["sequences"] < int(sys.argv[2]) or model["divergences"]:
    sys.exit(f"ci: the model ran {model['sequences']} sequences with {len(model['divergences'])} divergences")
print(f"ci: the model ran {model['sequences']} sequences, {model['steps']} steps on {model['backend']}: no divergence")
EOF
}

# Whether this tree's san-hil has a command (or an option of one): a stage that another issue adds runs as
# soon as its command is in the tree. $@: the command's words, then the option to look for (or "").
san_hil_has() {
    local want=${!#} words=("${@:1:$#-1}")
    .venv/bin/san-hil "${words[@]}" --help > /dev/null 2>&1 || return 1
    [[ -z $want ]] || .venv/bin/san-hil "${words[@]}" --help 2>/dev/null | grep -qE -- "(^|[[:space:],[])$want([[:space:],=]|$)"
}
