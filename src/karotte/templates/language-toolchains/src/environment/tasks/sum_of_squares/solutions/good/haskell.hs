main :: IO ()
main = do
  n <- readLn :: IO Integer
  print (sum [k * k | k <- [1 .. n]])
