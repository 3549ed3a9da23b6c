//! The `lb` command: its arguments, what each command does, and how replies are printed.
pub mod args;
pub mod cluster;
pub mod commands;
pub mod generate;
pub mod options;
pub mod render;
pub mod version;
