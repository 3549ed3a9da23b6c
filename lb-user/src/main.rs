//! The `lb` command: the daemon, its API client, and the one-shot `load`/`unload`. A failure
//! prints a one-line reason on stderr (a JSON object under `--json`) and exits with the code
//! that tells the cases apart (`cli::args::EXIT_*`, docs/operating.md "Using the CLI").
use clap::Parser as _;
use lb_user::api;

mod cli;

use cli::args::{EXIT_NO_ANSWER, EXIT_NOT_APPLIED, EXIT_REFUSED, EXIT_UNREACHABLE, EXIT_USAGE};

/// The exit code for `e`: 3 for a change saved but not applied yet, 4 when the daemon could
/// not be asked (or refused this user), 5 when it went away before it answered, 2 for a
/// flag's value lb cannot read (nothing asked), 1 for everything refused.
fn exit_code(e: &anyhow::Error) -> i32 {
    if cli::commands::saved(e) || e.downcast_ref::<cli::commands::NotApplied>().is_some() {
        EXIT_NOT_APPLIED
    } else if e.downcast_ref::<api::Unreachable>().is_some()
        || (e.downcast_ref::<api::Refused>())
            .is_some_and(|r| r.status == hyper::StatusCode::FORBIDDEN)
    {
        EXIT_UNREACHABLE
    } else if e.downcast_ref::<api::NoAnswer>().is_some() {
        EXIT_NO_ANSWER
    } else if e.downcast_ref::<cli::commands::Usage>().is_some() {
        EXIT_USAGE
    } else {
        EXIT_REFUSED
    }
}

/// Whether the command line asks for JSON, read from the words themselves: for a usage error,
/// when the parse that would say so has failed.
fn asked_for_json() -> bool {
    std::env::args().any(|a| a == "-j" || a == "--json")
}

/// Every failure's one style: `lb: MESSAGE` on stderr, or under `--json` one JSON object
/// carrying the exit code too; then the exit with `code`.
fn fail(message: &str, code: i32, json: bool) -> ! {
    if json {
        eprintln!(
            "{}",
            serde_json::json!({ "error": message, "exit_code": code })
        );
    } else {
        eprintln!("lb: {message}");
    }
    std::process::exit(code);
}

fn main() {
    // `lb generate` (hidden): the man pages, completions and CLI reference, generated from the
    // CLI's definition; parsed apart from it so the tree it describes stays the public one.
    if std::env::args_os().nth(1).is_some_and(|a| a == "generate") {
        cli::generate::main();
    }
    // An empty variable is an unset one, as a shell user means `LB_SOCKET= lb …`; clap would
    // take it as a flag given without its value, and refuse even an explicit `--socket`.
    for var in ["LB_SOCKET", "LB_CLUSTER", "LB_CLUSTER_PREFIX"] {
        if std::env::var_os(var).is_some_and(|v| v.is_empty()) {
            // SAFETY: the first thing main does, before any thread is started.
            unsafe { std::env::remove_var(var) };
        }
    }
    let cli = match cli::args::Cli::try_parse() {
        Ok(cli) => cli,
        // Help and version exit 0 on stdout; a usage error exits 2 (EXIT_USAGE) on stderr, in
        // lb's one style with clap's usage line and tip kept, or as one JSON document of its
        // first line when the line asked for JSON (clap could not say so: it failed).
        Err(e) if e.use_stderr() => {
            let text = e.render().to_string();
            let text = text.strip_prefix("error: ").unwrap_or(&text);
            if asked_for_json() {
                fail(text.lines().next().unwrap_or_default(), EXIT_USAGE, true);
            }
            eprint!("lb: {text}");
            std::process::exit(EXIT_USAGE);
        }
        Err(e) => e.exit(),
    };
    let global = match cli.global() {
        Ok(global) => global,
        Err(e) => fail(&e, EXIT_USAGE, asked_for_json()),
    };
    let daemon = matches!(cli.cmd, cli::args::Cmd::Daemon { .. });
    if !daemon {
        // A client's output piped into `head` ends like every Unix tool's: killed by SIGPIPE,
        // not a panic on a failed write. The daemon keeps Rust's SIG_IGN: its sockets report
        // EPIPE as errors it handles.
        // SAFETY: called before any thread is started; SIG_DFL is a valid disposition.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LB_LOG").unwrap_or_else(|_| {
                // The daemon says what it does; one-shot commands only what went wrong.
                (if daemon { "info" } else { "warn" }).into()
            }),
        )
        .with_writer(std::io::stderr)
        // Colours for a reader, not for a journal or a log file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let json = global.json;
    if let Err(e) = cli::commands::run(cli, &global) {
        fail(&format!("{e:#}").replace('\n', " "), exit_code(&e), json);
    }
}
