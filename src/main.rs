fn main() {
    std::process::exit(summon::run(std::env::args_os()));
}
