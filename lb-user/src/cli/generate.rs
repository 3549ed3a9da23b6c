//! `lb generate` (hidden, as ripgrep's `rg --generate`): lb's man pages, shell completions and
//! Markdown CLI reference, generated from the CLI's clap definition ([`Cli`]) so that none of
//! them is written by hand or drifts from `lb --help`. `cargo xtask dist` packages the first
//! two; the third is docs/cli.md, which lb-user/tests/cli_reference.rs holds to what this
//! prints.
//!
//! It is parsed apart from [`Cli`] (main.rs hands it `lb generate …` before clap sees the line):
//! the command tree the pages and completions describe is exactly the public one, with no
//! hidden command in it to filter back out.
use std::{
    fmt::Write as _,
    io::Write as _,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};
use clap::{Arg, ArgAction, Command, CommandFactory as _, Parser, Subcommand};

use super::args::Cli;

#[derive(Parser)]
#[command(
    name = "lb generate",
    about = "Generate lb's man pages, shell completions or Markdown CLI reference from its CLI",
    disable_help_subcommand = true
)]
struct Generate {
    #[command(subcommand)]
    what: What,
}

#[derive(Subcommand)]
enum What {
    /// Write lb.1 and a page per command (lb-network-add.1, …) into DIR.
    Man { dir: PathBuf },
    /// Write the completions for bash (lb.bash), zsh (_lb) and fish (lb.fish) into DIR.
    Completions { dir: PathBuf },
    /// Print the Markdown CLI reference (docs/cli.md) on stdout.
    CliReference,
}

/// The command line a reader regenerates docs/cli.md with.
pub const REGENERATE: &str =
    "cargo run -p lb-user --bin lb -- generate cli-reference > docs/cli.md";

/// `lb generate …` (`std::env::args` from `generate` on): does it and exits.
pub fn main() -> ! {
    let args = Generate::parse_from(std::env::args_os().skip(1));
    let done = match args.what {
        What::Man { dir } => man(&dir).map(|files| say_written(&dir, &files)),
        What::Completions { dir } => completions(&dir).map(|files| say_written(&dir, &files)),
        What::CliReference => {
            let mut stdout = std::io::stdout().lock();
            (stdout.write_all(cli_reference().as_bytes()))
                .and_then(|()| stdout.flush())
                .context("writing the CLI reference to stdout")
        }
    };
    match done {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("lb: generate: {e:#}");
            std::process::exit(1);
        }
    }
}

fn say_written(dir: &Path, files: &[String]) {
    eprintln!(
        "lb generate: wrote {} in {}",
        files.join(" "),
        dir.display()
    );
}

/// The public command tree, built (global options propagated, bin names set) and without
/// clap's `help` subcommand, which pages and references would otherwise list as a command.
fn documented() -> Command {
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    cmd
}

/// `cmd` and its visible subcommands, depth first, parents before children.
fn visible_tree(cmd: &Command) -> Vec<&Command> {
    let mut all = vec![cmd];
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        all.extend(visible_tree(sub));
    }
    all
}

/// The page name of a command: `lb`, `lb-network-add`.
fn page_name(cmd: &Command) -> &str {
    cmd.get_display_name().unwrap_or_else(|| cmd.get_name())
}

/// Writes the man pages into `dir`: lb.1 and one page per command, each ending with its
/// SEE ALSO; lb.1 also says what lb-cni is. Returns the file names written.
fn man(dir: &Path) -> Result<Vec<String>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let root = documented();
    let source = format!("lb {}", env!("CARGO_PKG_VERSION"));
    let mut written = Vec::new();
    for cmd in visible_tree(&root) {
        let man = clap_mangen::Man::new(cmd.clone())
            .source(source.clone())
            .manual("lb manual");
        let mut page = Vec::new();
        man.render(&mut page).context("rendering a man page")?;
        // clap_mangen heads the after-help "EXTRA"; man-pages(7) has NOTES for it.
        let mut page = String::from_utf8(page)
            .context("a man page that is not UTF-8")?
            .replace("\n.SH EXTRA\n", "\n.SH NOTES\n");
        if std::ptr::eq(cmd, &root) {
            page += &files_section();
            page += LB_CNI_SECTION;
        }
        page += &see_also(&root, cmd);
        let name = man.get_filename();
        let path = dir.join(&name);
        std::fs::write(&path, page).with_context(|| format!("writing {}", path.display()))?;
        written.push(name);
    }
    Ok(written)
}

/// lb.1's FILES: where the daemon keeps its socket, state and pins unless told otherwise.
fn files_section() -> String {
    let file =
        |path: &str, what: &str| format!(".TP\n\\fI{}\\fR\n{what}\n", path.replace('-', r"\-"));
    [
        ".SH FILES\n".to_owned(),
        file(
            lb_user::api::DEFAULT_SOCKET,
            r"The daemon's API socket (\fB\-\-socket\fR, \fBLB_SOCKET\fR).",
        ),
        file(
            lb_user::daemon::DEFAULT_STATE_DIR,
            r"The daemon's desired state (\fB\-\-state\-dir\fR).",
        ),
        file(
            lb_user::dataplane::ebpf::DEFAULT_BPFFS,
            r"Pinned maps and links, one directory per network (\fB\-\-bpffs\fR).",
        ),
    ]
    .concat()
}

/// lb.1's section on lb-cni, which has no clap definition (the runtime runs it, with the
/// CNI_* variables and a JSON configuration).
const LB_CNI_SECTION: &str = r#".SH "CNI PLUGIN"
\fBlb\-cni\fR is lb's CNI plugin (CNI spec 0.3.0 to 1.1.0), in place of the reference
\fBportmap\fR plugin: chained after a \fBbridge\fR plugin, it publishes a container's
\fBportMappings\fR as a service of the daemon it reaches at its API socket, and removes it
again on DEL. It goes where the container runtime looks for CNI plugins: the Debian package
installs it as \fI/usr/lib/cni/lb\-cni\fR, beside Debian's reference plugins (Nomad's
\fBcni_path\fR, containerd's CNI \fBbin_dir\fR). Run by hand, without \fBCNI_COMMAND\fR, it
prints its version and the CNI versions it supports on stderr and exits 0.
"#;

/// A page's SEE ALSO: lb(1) and its parent command's page, its subcommands' pages; lb(1)'s
/// own lists every command's.
fn see_also(root: &Command, cmd: &Command) -> String {
    let mut pages: Vec<String> = Vec::new();
    if std::ptr::eq(cmd, root) {
        pages.extend(
            (visible_tree(root).into_iter().skip(1)).map(|c| format!("{}(1)", page_name(c))),
        );
    } else {
        pages.push("lb(1)".to_owned());
        if let Some((parent, _)) = command_path(cmd).rsplit_once(' ')
            && parent != "lb"
        {
            pages.push(format!("{}(1)", parent.replace(' ', "-")));
        }
        pages.extend(
            (cmd.get_subcommands().filter(|s| !s.is_hide_set()))
                .map(|s| format!("{}(1)", page_name(s))),
        );
    }
    let pages: Vec<String> = pages
        .iter()
        .map(|p| {
            let (name, section) = p.split_once('(').expect("name(section)");
            format!("\\fB{}\\fR({section}", name.replace('-', "\\-"))
        })
        .collect();
    format!(".SH \"SEE ALSO\"\n{}\n", pages.join(",\n"))
}

/// Writes bash, zsh and fish completions into `dir`; returns the file names written.
fn completions(dir: &Path) -> Result<Vec<String>> {
    use clap_complete::Shell;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut cmd = Cli::command();
    let mut written = Vec::new();
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let path = clap_complete::generate_to(shell, &mut cmd, "lb", dir)
            .with_context(|| format!("writing {shell} completions in {}", dir.display()))?;
        written.push(
            (path.file_name())
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        );
    }
    Ok(written)
}

/// The Markdown CLI reference: every command (depth first), its usage, arguments and options
/// with their help, values, defaults and environment variables.
pub fn cli_reference() -> String {
    let root = documented();
    let mut md = String::new();
    let w = &mut md;
    let _ = writeln!(w, "# lb command-line reference\n");
    let _ = writeln!(
        w,
        "<!-- Generated from the CLI's definition (lb-user/src/cli/args.rs) by `lb generate \
         cli-reference`; do not edit. Regenerate with\n     {REGENERATE}\n     \
         (lb-user/tests/cli_reference.rs fails while this file differs from it). -->\n"
    );
    let _ = writeln!(
        w,
        "Every `lb` command with its arguments and options: what `lb COMMAND --help` prints, \
         and what the man pages say (`man lb`, `man lb-network-add`). Every command also \
         takes `-h`/`--help`.\n"
    );
    let _ = writeln!(w, "## Commands\n");
    for cmd in visible_tree(&root).into_iter().skip(1) {
        let path = command_path(cmd);
        let depth = path.matches(' ').count() - 1;
        let _ = writeln!(
            w,
            "{}- [`{path}`](#{}): {}",
            "  ".repeat(depth),
            path.replace(' ', "-"),
            one_line(cmd.get_about().map(|s| s.to_string()).unwrap_or_default())
        );
    }
    let _ = writeln!(w);
    for cmd in visible_tree(&root) {
        // lb's own commands are listed above.
        command_section(w, cmd, !std::ptr::eq(cmd, &root));
    }
    // One newline at the end, as an editor saves it.
    while md.ends_with("\n\n") {
        md.pop();
    }
    md
}

/// `lb network add`: a command as typed (its bin name, once the tree is built).
fn command_path(cmd: &Command) -> String {
    cmd.get_bin_name()
        .unwrap_or_else(|| cmd.get_name())
        .to_owned()
}

/// `text` ending with a full stop (clap drops a one-paragraph doc comment's), so that what
/// follows it reads as another sentence.
fn sentence(text: String) -> String {
    if text.is_empty() || text.ends_with('.') {
        text
    } else {
        text + "."
    }
}

fn one_line(text: String) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn command_section(w: &mut String, cmd: &Command, list_commands: bool) {
    let _ = writeln!(w, "## {}\n", command_path(cmd));
    let aliases: Vec<&str> = cmd.get_visible_aliases().collect();
    if !aliases.is_empty() {
        let path = command_path(cmd);
        let parent = path.rsplit_once(' ').map_or("", |(p, _)| p);
        let spelled: Vec<String> = (aliases.iter())
            .map(|a| format!("`{parent} {a}`"))
            .collect();
        let _ = writeln!(w, "Also: {}.\n", spelled.join(", "));
    }
    if let Some(about) = cmd.get_long_about().or_else(|| cmd.get_about()) {
        let _ = writeln!(w, "{}\n", sentence(paragraphs(&about.to_string())));
    }
    let mut usage = cmd.clone();
    let usage = usage.render_usage().to_string();
    let _ = writeln!(w, "```text\n{}\n```\n", usage.trim_end());
    // A command's own options and those a parent passes down (`global`): all it takes.
    let shown = |a: &&Arg| {
        !a.is_hide_set() && !matches!(a.get_action(), ArgAction::Help | ArgAction::Version)
    };
    let positionals: Vec<&Arg> = cmd.get_positionals().filter(shown).collect();
    let options: Vec<&Arg> = (cmd.get_arguments())
        .filter(|a| !a.is_positional())
        .filter(shown)
        .collect();
    if !positionals.is_empty() {
        let _ = writeln!(w, "Arguments:\n");
        for arg in positionals {
            argument(w, arg);
        }
        let _ = writeln!(w);
    }
    if !options.is_empty() {
        let _ = writeln!(w, "Options:\n");
        for arg in options {
            argument(w, arg);
        }
        let _ = writeln!(w);
    }
    let subs: Vec<&Command> = cmd.get_subcommands().filter(|s| !s.is_hide_set()).collect();
    if !subs.is_empty() && list_commands {
        let _ = writeln!(w, "Commands:\n");
        for sub in subs {
            let path = command_path(sub);
            let _ = writeln!(
                w,
                "- [`{path}`](#{}): {}",
                path.replace(' ', "-"),
                one_line(sub.get_about().map(|s| s.to_string()).unwrap_or_default())
            );
        }
        let _ = writeln!(w);
    }
    if let Some(after) = cmd.get_after_long_help().or_else(|| cmd.get_after_help()) {
        let _ = writeln!(w, "{}\n", paragraphs(&after.to_string()));
    }
}

/// Help text as Markdown paragraphs: clap keeps a doc comment's paragraphs apart with a blank
/// line and joins the lines within one.
fn paragraphs(text: &str) -> String {
    (text.split("\n\n"))
        .map(|p| one_line(p.to_owned()))
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// One argument as a list item: how it is spelled, then its help, allowed values, default and
/// environment variable.
fn argument(w: &mut String, arg: &Arg) {
    let takes_value = arg.get_action().takes_values();
    let names: Vec<String> = (arg.get_value_names())
        .map(|names| names.iter().map(|n| n.to_string()).collect())
        .unwrap_or_else(|| vec![arg.get_id().as_str().to_uppercase()]);
    let values = (names.iter())
        .map(|n| format!("<{n}>"))
        .collect::<Vec<_>>()
        .join(" ");
    // As clap's usage spells them: `<NAME>`, `[NETWORK]`, `<FILE>...`.
    let spelled = if arg.is_positional() {
        let many = if matches!(arg.get_action(), ArgAction::Append) {
            "..."
        } else {
            ""
        };
        if arg.is_required_set() {
            format!("{values}{many}")
        } else {
            format!("[{}]{many}", names.join(" "))
        }
    } else {
        let mut names = Vec::new();
        if let Some(short) = arg.get_short() {
            names.push(format!("-{short}"));
        }
        if let Some(long) = arg.get_long() {
            names.push(format!("--{long}"));
        }
        let names = names.join(", ");
        let optional = arg.get_num_args().is_some_and(|n| n.min_values() == 0);
        match (takes_value, optional) {
            (false, _) => names,
            (true, false) => format!("{names} {values}"),
            (true, true) => format!("{names} [{values}]"),
        }
    };
    let mut notes = Vec::new();
    if arg.is_required_set() {
        notes.push("required");
    }
    if matches!(arg.get_action(), ArgAction::Append) {
        notes.push("repeatable");
    }
    let notes = if notes.is_empty() {
        String::new()
    } else {
        format!(" ({})", notes.join(", "))
    };
    let help = (arg.get_long_help().or_else(|| arg.get_help()))
        .map(|h| sentence(paragraphs(&h.to_string())).replace("\n\n", "\n\n  "))
        .unwrap_or_default();
    // What is said of it: its help, then its values, default and variable.
    let mut said = help;
    let possible: Vec<clap::builder::PossibleValue> = if takes_value {
        arg.get_possible_values()
            .into_iter()
            .filter(|v| !v.is_hide_set())
            .collect()
    } else {
        Vec::new()
    };
    let described = possible.iter().any(|v| v.get_help().is_some());
    if !possible.is_empty() && !described {
        let names: Vec<String> = (possible.iter())
            .map(|v| format!("`{}`", v.get_name()))
            .collect();
        let _ = write!(said, " Values: {}.", names.join(", "));
    }
    let defaults: Vec<String> = (arg.get_default_values().iter())
        .map(|v| format!("`{}`", v.to_string_lossy()))
        .collect();
    if takes_value && !defaults.is_empty() {
        let _ = write!(said, " Default: {}.", defaults.join(", "));
    }
    if let Some(env) = arg.get_env() {
        let _ = write!(said, " Environment: `{}`.", env.to_string_lossy());
    }
    let said = said.trim_start();
    if said.is_empty() {
        let _ = writeln!(w, "- `{spelled}`{notes}");
    } else {
        let _ = writeln!(w, "- `{spelled}`{notes}: {said}");
    }
    if described {
        for v in possible {
            let help = v.get_help().map(|h| one_line(h.to_string()));
            let _ = writeln!(
                w,
                "  - `{}`{}",
                v.get_name(),
                help.map(|h| format!(": {h}")).unwrap_or_default()
            );
        }
    }
}
