//! `cargo xtask`: development chores. `cargo xtask tidy` runs the same checks as the tidy test.

mod tidy;

fn main() -> std::process::ExitCode {
    match std::env::args().nth(1).as_deref() {
        Some("tidy") => {
            let root = tidy::workspace_root();
            let problems = tidy::check(&root);
            for problem in &problems {
                eprintln!("{problem}");
            }
            if problems.is_empty() { std::process::ExitCode::SUCCESS } else { std::process::ExitCode::FAILURE }
        }
        _ => {
            eprintln!("usage: cargo xtask tidy");
            std::process::ExitCode::from(2)
        }
    }
}
