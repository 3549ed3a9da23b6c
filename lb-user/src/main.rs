fn main() {
    println!("lb: not built yet");
}
