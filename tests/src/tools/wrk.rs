//! wrk as the HTTP load generator, and its report read into numbers (requests, non-2xx
//! answers, socket errors).
use std::fs;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};

use super::{TempDir, in_netns, run_tool};
use crate::netns::Netns;

/// How [`wrk`] loads a URL.
#[derive(Debug, Clone)]
pub struct WrkOptions {
    /// Whole seconds (wrk's `-d` takes no fractions).
    pub duration: Duration,
    /// Open connections in total (wrk's `-c`), at least `threads`.
    pub connections: u32,
    pub threads: u32,
    /// Sends `Connection: close`: one request per connection, a connection storm.
    pub close: bool,
    /// Pins wrk to this CPU (`taskset -c`).
    pub cpu: Option<usize>,
}

impl Default for WrkOptions {
    fn default() -> WrkOptions {
        WrkOptions {
            duration: Duration::from_secs(2),
            connections: 10,
            threads: 1,
            close: false,
            cpu: None,
        }
    }
}

/// What one wrk run reports.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WrkResult {
    /// Completed requests (any status).
    pub requests: u64,
    /// The run's length as wrk prints it (two decimals, e.g. `2.10s`).
    pub secs: f64,
    pub connect_errors: u64,
    pub read_errors: u64,
    pub write_errors: u64,
    pub timeouts: u64,
    /// Responses with a status outside 2xx and 3xx.
    pub non_2xx: u64,
}

impl WrkResult {
    /// Every failed exchange: socket errors, timeouts and non-2xx/3xx answers.
    pub fn errors(&self) -> u64 {
        self.connect_errors + self.read_errors + self.write_errors + self.timeouts + self.non_2xx
    }

    pub fn requests_per_sec(&self) -> f64 {
        if self.secs > 0.0 {
            self.requests as f64 / self.secs
        } else {
            0.0
        }
    }

    /// Parses wrk 4.1's text report. The `Socket errors:` and `Non-2xx or 3xx responses:`
    /// lines appear only when their counts are not all zero.
    pub fn parse(report: &str) -> Result<WrkResult> {
        let mut result = WrkResult::default();
        let mut seen_requests = false;
        for line in report.lines().map(str::trim) {
            if let Some((requests, rest)) = line.split_once(" requests in ") {
                // `198027 requests in 2.10s, 31.54MB read`
                result.requests = requests
                    .parse()
                    .with_context(|| format!("wrk requests in {line:?}"))?;
                let time = rest.split(',').next().unwrap_or_default();
                result.secs =
                    wrk_secs(time).with_context(|| format!("wrk run time in {line:?}"))?;
                seen_requests = true;
            } else if let Some(errors) = line.strip_prefix("Socket errors:") {
                // `Socket errors: connect 0, read 43, write 16489, timeout 0`
                for part in errors.split(',') {
                    let (kind, n) = part
                        .trim()
                        .split_once(' ')
                        .with_context(|| format!("wrk socket errors {line:?}"))?;
                    let n: u64 = n
                        .parse()
                        .with_context(|| format!("wrk socket errors {line:?}"))?;
                    match kind {
                        "connect" => result.connect_errors = n,
                        "read" => result.read_errors = n,
                        "write" => result.write_errors = n,
                        "timeout" => result.timeouts = n,
                        _ => bail!("wrk socket error kind {kind:?} in {line:?}"),
                    }
                }
            } else if let Some(n) = line.strip_prefix("Non-2xx or 3xx responses:") {
                result.non_2xx = n
                    .trim()
                    .parse()
                    .with_context(|| format!("wrk non-2xx count in {line:?}"))?;
            }
        }
        ensure!(
            seen_requests,
            "no `N requests in` line in wrk's report: {report}"
        );
        Ok(result)
    }
}

/// wrk's run time (`format_time_us`): a number with one of `us`, `ms`, `s`, `m`, `h`.
fn wrk_secs(time: &str) -> Result<f64> {
    let time = time.trim();
    let split = time
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .with_context(|| format!("no unit in {time:?}"))?;
    let (number, unit) = time.split_at(split);
    let number: f64 = number.parse().with_context(|| format!("{time:?}"))?;
    let scale = match unit {
        "us" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => bail!("unknown time unit in {time:?}"),
    };
    Ok(number * scale)
}

/// Runs wrk (Debian `wrk`, 4.1) from `ns` against `url` and returns its report. wrk itself
/// fails (an error here) when its first test connection is refused; refusals later in the run
/// are counted as errors (as write errors, by wrk 4.1).
pub fn wrk(ns: &Netns, url: &str, opts: &WrkOptions) -> Result<WrkResult> {
    wrk_with(ns, url, opts, None)
}

/// Like [`wrk`], with a Lua `script` (wrk's `--script`), e.g. one whose `setup(thread)` sets
/// `thread.addr` to send each thread's connections to another server.
pub fn wrk_script(ns: &Netns, url: &str, opts: &WrkOptions, script: &str) -> Result<WrkResult> {
    let dir = TempDir::new("wrk")?;
    let path = dir.join("script.lua");
    fs::write(&path, script).with_context(|| format!("writing {}", path.display()))?;
    wrk_with(ns, url, opts, Some(&path))
}

fn wrk_with(ns: &Netns, url: &str, opts: &WrkOptions, script: Option<&Path>) -> Result<WrkResult> {
    let secs = opts.duration.as_secs();
    ensure!(
        secs > 0 && opts.duration.subsec_nanos() == 0,
        "wrk duration {:?}: whole seconds only",
        opts.duration
    );
    ensure!(
        opts.threads > 0 && opts.connections >= opts.threads,
        "wrk: {} connections over {} threads",
        opts.connections,
        opts.threads
    );
    let mut args = vec![
        format!("--threads={}", opts.threads),
        format!("--connections={}", opts.connections),
        format!("--duration={secs}s"),
        "--timeout=5s".to_owned(),
    ];
    if opts.close {
        args.extend(["--header".to_owned(), "Connection: close".to_owned()]);
    }
    if let Some(script) = script {
        args.push(format!("--script={}", script.display()));
    }
    args.push(url.to_owned());
    let cmd = in_netns(ns, opts.cpu, "wrk", &args);
    // wrk stops at `duration`; what remains is its last timeouts and the report.
    let limit = opts.duration + Duration::from_secs(15);
    let run = run_tool(cmd, &format!("wrk {url} from {}", ns.name()), limit)?;
    WrkResult::parse(&run.stdout)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// wrk 4.1 against nginx, keep-alive, no errors: neither optional line.
    const WRK_CLEAN: &str = "\
Running 2s test @ http://10.77.0.2:8080/
  1 threads and 10 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   103.24us  166.41us   4.32ms   98.40%
    Req/Sec    95.06k    23.19k  135.73k    76.19%
  198027 requests in 2.10s, 31.54MB read
Requests/sec:  94300.01
Transfer/sec:     15.02MB
";

    /// Every answer a 404.
    const WRK_NON_2XX: &str = "\
Running 1s test @ http://10.77.0.2:8082/
  1 threads and 4 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    48.37us   70.90us   2.40ms   99.29%
    Req/Sec    82.12k     9.45k  102.07k    72.73%
  89497 requests in 1.10s, 14.85MB read
  Non-2xx or 3xx responses: 89497
Requests/sec:  81333.55
Transfer/sec:     13.50MB
";

    /// The server killed one second into a `Connection: close` run (404s before that).
    const WRK_SOCKET_ERRORS: &str = "\
Running 3s test @ http://10.77.0.2:8082/
  1 threads and 50 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.09ms  667.68us   5.63ms   64.26%
    Req/Sec    17.62k     1.49k   19.92k    70.00%
  17554 requests in 3.00s, 2.83MB read
  Socket errors: connect 0, read 43, write 16489, timeout 0
  Non-2xx or 3xx responses: 17554
Requests/sec:   5843.41
Transfer/sec:      0.94MB
";

    #[test]
    fn wrk_report_without_optional_lines_has_no_errors() {
        let r = WrkResult::parse(WRK_CLEAN).unwrap();
        assert_eq!(r.requests, 198_027);
        assert!((r.secs - 2.10).abs() < 1e-9, "secs {}", r.secs);
        assert_eq!(r.errors(), 0, "{r:?}");
        assert!((r.requests_per_sec() - 198_027.0 / 2.1).abs() < 1e-6);
    }

    #[test]
    fn wrk_report_counts_non_2xx_answers() {
        let r = WrkResult::parse(WRK_NON_2XX).unwrap();
        assert_eq!((r.requests, r.non_2xx), (89_497, 89_497), "{r:?}");
        assert_eq!(r.errors(), 89_497, "{r:?}");
    }

    #[test]
    fn wrk_report_counts_socket_errors_by_kind() {
        let r = WrkResult::parse(WRK_SOCKET_ERRORS).unwrap();
        assert_eq!(
            r,
            WrkResult {
                requests: 17_554,
                secs: 3.0,
                connect_errors: 0,
                read_errors: 43,
                write_errors: 16_489,
                timeouts: 0,
                non_2xx: 17_554,
            }
        );
        assert_eq!(r.errors(), 43 + 16_489 + 17_554);
    }

    #[test]
    fn wrk_times_in_every_unit_and_a_report_without_requests_is_refused() {
        for (time, secs) in [
            ("2.10s", 2.1),
            ("1.00m", 60.0),
            ("1.50h", 5400.0),
            ("500.00ms", 0.5),
            ("10.00us", 1e-5),
        ] {
            assert!((wrk_secs(time).unwrap() - secs).abs() < 1e-9, "{time}");
        }
        assert!(wrk_secs("2.10x").is_err());
        assert!(WrkResult::parse("unable to connect to 10.0.0.1:80 Connection refused").is_err());
    }
}
