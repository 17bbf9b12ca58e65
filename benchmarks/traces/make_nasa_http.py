"""A real public request trace for `optkit capacity --history`: the NASA Kennedy Space Center WWW server's HTTP
requests, July 1995 (the NASA-HTTP trace), counted per minute, written as `timestamp,requests_per_s` (UTC).

Source (recorded here so the CSV can be made again and checked):
  the trace      NASA-HTTP, Jim Dumoulin (KSC), Internet Traffic Archive: https://ita.ee.lbl.gov/html/contrib/NASA-HTTP.html
                 "Permission: The traces may be freely redistributed." (the archive's terms for this trace)
  the counts     github.com/wolfycodes4fun/tsf-models-autoscaling, datasets/nasa_requests_per_minute.csv at commit
                 ea331c7904049fd85aefd139aeda7dd8f29c12b8 (git blob 80db3b912b5b9115a40ef68afc35a8585edb33d2): the
                 Jul95 and Aug95 logs counted per minute by its create_dataset.py, minutes with no request filled with
                 0. The repository carries no licence file of its own; the counts are a mechanical aggregation of the
                 trace above (no creative content), redistributed under the trace's permission.

What this script does, and says:
  - keeps 1995-07-01 00:00 to 1995-07-27 23:59 local time (27 days, Saturday to Thursday): the Jul95 log ends on
    07-28 13:32, and the source fills the days after it with zeros, which are no traffic figure;
  - the log's times are US Eastern daylight time (-0400): written as UTC (+4 h), ISO 8601 with a Z;
  - requests per second = the minute's count / 60;
  - a run of >= 10 minutes with no request at all inside the window (a server or logging outage: the site had
    ~100 requests a minute then) is left out, as a gap, so `optkit capacity` fills and counts it rather than reading
    zero traffic; the runs are printed. Shorter zero runs are kept as 0 (night-time silence).
  - 07-13 is the day of the STS-70 launch: the trace's real surge (405 requests in its busiest minute).

Run (the source file is 2 MB; no network here: fetch it with git or curl first):
  git clone https://github.com/wolfycodes4fun/tsf-models-autoscaling /tmp/tsf && \
    git -C /tmp/tsf show ea331c7904049fd85aefd139aeda7dd8f29c12b8:datasets/nasa_requests_per_minute.csv > /tmp/nasa.csv
  python benchmarks/traces/make_nasa_http.py /tmp/nasa.csv -o benchmarks/traces/nasa_http_1995_07.csv
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import os
import sys
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

SOURCE = {
    "repository": "https://github.com/wolfycodes4fun/tsf-models-autoscaling",
    "path": "datasets/nasa_requests_per_minute.csv",
    "commit": "ea331c7904049fd85aefd139aeda7dd8f29c12b8",
    "git_blob": "80db3b912b5b9115a40ef68afc35a8585edb33d2",
    "trace": "NASA-HTTP (Jul95), https://ita.ee.lbl.gov/html/contrib/NASA-HTTP.html",
    "licence": "The traces may be freely redistributed (Internet Traffic Archive terms for NASA-HTTP)",
}
START = datetime(1995, 7, 1, 0, 0)
END = datetime(1995, 7, 28, 0, 0)        # exclusive: the Jul95 log ends on 07-28 13:32
LOCAL = timezone(timedelta(hours=-4))    # the log's own offset (-0400)
OUTAGE_MIN = 10


def git_blob(raw: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(raw) + raw).hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", help="nasa_requests_per_minute.csv at the recorded commit")
    ap.add_argument("-o", "--output", default="benchmarks/traces/nasa_http_1995_07.csv")
    args = ap.parse_args()
    raw = Path(args.source).read_bytes()
    blob = git_blob(raw)
    if blob != SOURCE["git_blob"]:
        print(f"error: {args.source} is git blob {blob}, not the recorded {SOURCE['git_blob']} (another version of "
              "the file): check it out at the recorded commit", file=sys.stderr)
        return 2
    minutes: list[tuple[datetime, int]] = []
    for row in csv.DictReader(raw.decode("utf-8").splitlines()):
        t = datetime.strptime(row["time"], "%Y-%m-%d %H:%M:%S")
        if START <= t < END:
            minutes.append((t, int(row["number_of_requests"])))
    expected = int((END - START).total_seconds() // 60)
    if len(minutes) != expected or any(b[0] - a[0] != timedelta(minutes=1) for a, b in zip(minutes, minutes[1:])):
        print(f"error: expected {expected} consecutive minutes, got {len(minutes)}", file=sys.stderr)
        return 2
    drop: set[int] = set()
    i = 0
    while i < len(minutes):
        j = i
        while j < len(minutes) and minutes[j][1] == 0:
            j += 1
        if j - i >= OUTAGE_MIN:
            drop.update(range(i, j))
            print(f"outage left out as a gap: {minutes[i][0]} to {minutes[j - 1][0]} local ({j - i} minutes with no "
                  "request)")
        i = max(j, i + 1)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    try:
        with os.fdopen(fd, "w", newline="") as f:
            f.write("timestamp,requests_per_s\n")
            for k, (t, n) in enumerate(minutes):
                if k not in drop:
                    utc = t.replace(tzinfo=LOCAL).astimezone(timezone.utc)
                    f.write(f"{utc:%Y-%m-%dT%H:%M:%SZ},{n / 60:.4f}\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        os.unlink(tmp)
        raise
    kept = [n for k, (_, n) in enumerate(minutes) if k not in drop]
    print(f"wrote {out}: {len(kept)} minutes ({len(drop)} left out), mean {sum(kept) / len(kept) / 60:.3f} req/s, "
          f"peak {max(kept) / 60:.3f} req/s; source {SOURCE['repository']} {SOURCE['path']} @ {SOURCE['commit']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
