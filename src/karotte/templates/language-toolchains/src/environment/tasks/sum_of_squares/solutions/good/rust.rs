use std::io::Read;

fn main() {
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input).unwrap();
    let n: u64 = input.trim().parse().unwrap();
    let sum: u64 = (1..=n).map(|k| k * k).sum();
    println!("{}", sum);
}
