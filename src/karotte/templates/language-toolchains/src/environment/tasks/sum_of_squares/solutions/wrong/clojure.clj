(let [n (Long/parseLong (.trim (read-line)))]
  (println (reduce + (map identity (range 1 (inc n))))))
