//! Placeholder: being written.

fn main() {
    println!("streams bench: not written yet");
}
