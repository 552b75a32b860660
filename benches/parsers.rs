//! Placeholder: being written.

fn main() {
    println!("parsers bench: not written yet");
}
