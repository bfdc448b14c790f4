//! The project as a person meets it: its commands' answers on the command line, its README and
//! docs run as written, its monitoring, and the layout of its code. One test binary, so that a
//! fresh build links it once.

#[path = "../common/mod.rs"]
mod common;

mod cli;
mod dist;
mod docs;
mod harness;
#[path = "../common/kustomize.rs"]
mod kustomize;
mod layout;
mod monitoring;
mod workflows;
