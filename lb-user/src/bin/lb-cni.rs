//! `lb-cni`: the CNI plugin (see `lb_user::cni`). A result or a CNI error goes to stdout; an
//! error also exits non-zero, as the spec asks. Run by hand (no `CNI_COMMAND`), it says what
//! it is on stderr and exits 0, as the reference plugins do (their `skel`), before reading
//! stdin: a terminal is not kept waiting.
use std::io::Read as _;

use lb_user::cni::{self, CniError, Env, SUPPORTED_VERSIONS, code};

fn main() {
    if std::env::var_os("CNI_COMMAND").is_none_or(|c| c.is_empty()) {
        eprintln!(
            "CNI lb plugin v{} (commit {})",
            env!("CARGO_PKG_VERSION"),
            env!("LB_COMMIT")
        );
        eprintln!(
            "CNI protocol versions supported: {}",
            SUPPORTED_VERSIONS.join(", ")
        );
        return;
    }
    let mut stdin = Vec::new();
    let out = match std::io::stdin().read_to_end(&mut stdin) {
        Ok(_) => cni::run(&Env::from_process(), &stdin),
        Err(e) => Err(CniError::with(code::IO_FAILURE, "reading stdin", &e.into())),
    };
    match out {
        Ok(result) => {
            if !result.is_empty() {
                println!("{result}");
            }
        }
        Err(e) => {
            println!("{}", e.to_json());
            std::process::exit(1);
        }
    }
}
