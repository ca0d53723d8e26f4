(let [n (Long/parseLong (.trim (read-line)))]
  (println (reduce + (map #(* % %) (range 1 (inc n))))))
