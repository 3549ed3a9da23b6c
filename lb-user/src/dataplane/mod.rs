//! Dataplanes: what turns composed elements into kernel state.
pub mod ebpf;
