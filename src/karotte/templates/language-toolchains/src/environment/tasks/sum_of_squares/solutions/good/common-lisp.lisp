(let ((n (read)))
  (format t "~D~%" (loop for k from 1 to n sum (* k k))))
