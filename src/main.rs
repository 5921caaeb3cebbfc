//! The `summon` binary: hands the arguments to the library and exits with its code.

/// A fast allocator: a run of many concurrent tasks allocates from several threads at once.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    std::process::exit(summon::run(std::env::args_os()));
}
