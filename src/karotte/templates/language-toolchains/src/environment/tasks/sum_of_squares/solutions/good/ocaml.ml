let () =
  let n = Scanf.scanf " %d" (fun x -> x) in
  let sum = ref 0 in
  for k = 1 to n do
    sum := !sum + (k * k)
  done;
  Printf.printf "%d\n" !sum
