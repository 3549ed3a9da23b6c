//! `lb-cni`: the CNI plugin (see `lb_user::cni`). A result or a CNI error goes to stdout; an
//! error also exits non-zero, as the spec asks.
use std::io::Read as _;

use lb_user::cni::{self, CniError, Env, code};

fn main() {
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
