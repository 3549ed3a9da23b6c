//! Host builds compile this crate as a build-dependency of `lb-user` (so cargo rebuilds the
//! object when it changes); the programs themselves are the `lb` binary, built for BPF only.
#![no_std]
