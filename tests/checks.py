"""What the tests/check_*.py scripts share: failures are counted and printed as they come,
and the script's exit status says whether there was one."""
FAILS = []


def check(cond, what):
    """Records and prints `what` as a failure unless cond; returns cond."""
    if not cond:
        FAILS.append(what)
        print("FAIL:", what)
    return cond


def verdict(script, mode):
    """The script's closing line and exit status: 1 with a failure, else 0."""
    print(f"{script} --mode {mode}: {'FAIL' if FAILS else 'ok'} ({len(FAILS)} failures)")
    return 1 if FAILS else 0
