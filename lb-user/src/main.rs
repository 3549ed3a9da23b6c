//! The `lb` command: the daemon, its API client, and the one-shot `load`/`unload`. Every
//! failure exits 1 with a one-line reason on stderr.
use clap::Parser as _;

mod cli;

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LB_LOG").unwrap_or_else(|_| {
                // The daemon says what it does; one-shot commands only what went wrong.
                let daemon = std::env::args().nth(1).as_deref() == Some("daemon");
                (if daemon { "info" } else { "warn" }).into()
            }),
        )
        .with_writer(std::io::stderr)
        // Colours for a reader, not for a journal or a log file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    if let Err(e) = cli::commands::run(cli::args::Cli::parse().cmd) {
        eprintln!("lb: {}", format!("{e:#}").replace('\n', " "));
        std::process::exit(1);
    }
}
